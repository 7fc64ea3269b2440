/* kvdrift: config unit tests: presets carry the published shapes, a written
 * config.json loads back identical, and bad configs are refused naming the
 * field and what was expected. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runners/config.h"

static void presets(void **st) {
    (void)st;
    kvd_config c;
    char err[KVD_ERR_LEN];
    for (const char *const *n = kvd_config_preset_names(); *n; n++) {
        assert_int_equal(kvd_config_preset(*n, &c, err), 0);
        assert_int_equal(kvd_config_validate(&c, err), 0);
    }
    assert_int_equal(kvd_config_preset("qwen3.5-397b-a17b", &c, err), 0);
    assert_int_equal(c.num_hidden_layers, 60);
    assert_int_equal(kvd_config_n_full(&c), 15);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 2);
    assert_int_equal(c.head_dim, 256);
    assert_int_equal(kvd_rot_dim(&c), 64);
    assert_int_equal(c.linear_num_value_heads, 64);
    assert_int_equal(c.vocab_size, 248320);
    assert_non_null(strstr(c.note, "num_experts 32 instead of 512"));
    for (int i = 0; i < 60; i++)
        assert_int_equal(c.layer_types[i], (i + 1) % 4 == 0 ? KVD_LAYER_FULL : KVD_LAYER_LINEAR);
    assert_int_equal(kvd_config_preset("qwen3-next-80b-a3b", &c, err), 0);
    assert_int_equal(c.num_hidden_layers, 48);
    assert_int_equal(kvd_config_n_full(&c), 12);
    assert_int_equal(c.linear_num_key_heads, 16);
    assert_int_equal(c.linear_num_value_heads, 32);
    assert_int_equal(kvd_config_preset("huge", &c, err), -1);
    assert_non_null(strstr(err, "unknown model preset 'huge'"));
}

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvd_cfg_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void round_trip(void **st) {
    (void)st;
    kvd_config a, b;
    char err[KVD_ERR_LEN];
    assert_int_equal(kvd_config_preset("small", &a, err), 0);
    char *json = kvd_config_to_json(&a);
    char *p = write_tmp(json);
    free(json);
    assert_int_equal(kvd_config_load(p, &b, err), 0);
    unlink(p);
    assert_int_equal(a.hidden_size, b.hidden_size);
    assert_int_equal(a.num_hidden_layers, b.num_hidden_layers);
    assert_memory_equal(a.layer_types, b.layer_types, sizeof(a.layer_types[0]) * 8);
    assert_int_equal(a.moe_intermediate_size, b.moe_intermediate_size);
    assert_true(a.rope_theta == b.rope_theta);
    assert_true(a.partial_rotary_factor == b.partial_rotary_factor);
    assert_true(a.rms_norm_eps == b.rms_norm_eps);
    assert_int_equal(a.norm_topk_prob, b.norm_topk_prob);
}

/* A config with a change spliced into the small preset's JSON. */
static int load_with(const char *key, const char *value, char *err) {
    kvd_config a, b;
    kvd_config_preset("small", &a, err);
    char *json = kvd_config_to_json(&a);
    char needle[96], *buf = malloc(strlen(json) + 256);
    snprintf(needle, sizeof needle, "\"%s\":", key);
    char *at = strstr(json, needle);
    assert_non_null(at);
    char *end = at + strlen(needle);
    /* skip the old value (a scalar or an array) */
    if (end[1] == '[') {
        end = strchr(end, ']') + 1;
    } else {
        while (*end && *end != ',' && *end != '\n') end++;
    }
    size_t pre = (size_t)(at - json);
    memcpy(buf, json, pre);
    sprintf(buf + pre, "%s %s%s", needle, value, end);
    char *p = write_tmp(buf);
    int rc = kvd_config_load(p, &b, err);
    unlink(p);
    free(json);
    free(buf);
    return rc;
}

static void refusals(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    assert_int_equal(load_with("num_key_value_heads", "3", err), -1);
    assert_non_null(strstr(
        err, "field 'num_key_value_heads': expected a divisor of num_attention_heads (8), got 3"));
    assert_int_equal(load_with("hidden_size", "0", err), -1);
    assert_non_null(strstr(err, "field 'hidden_size': expected a positive integer, got 0"));
    assert_int_equal(load_with("head_dim", "\"big\"", err), -1);
    assert_non_null(strstr(err, "field 'head_dim': expected an integer"));
    assert_int_equal(load_with("layer_types",
                               "[\"linear_attention\", \"linear_attention\", \"sliding\", "
                               "\"full_attention\", \"linear_attention\", \"linear_attention\", "
                               "\"linear_attention\", \"full_attention\"]",
                               err),
                     -1);
    assert_non_null(strstr(err, "field 'layer_types[2]': expected \"linear_attention\" or "
                                "\"full_attention\", got \"sliding\""));
    assert_int_equal(load_with("layer_types", "[\"full_attention\"]", err), -1);
    assert_non_null(strstr(err, "expected an array of 8 strings"));
    assert_int_equal(load_with("num_experts_per_tok", "17", err), -1);
    assert_non_null(strstr(err, "field 'num_experts_per_tok'"));
    assert_int_equal(load_with("linear_num_key_heads", "3", err), -1);
    assert_non_null(strstr(err, "field 'linear_num_key_heads'"));
    assert_int_equal(load_with("partial_rotary_factor", "1.5", err), -1);
    assert_non_null(strstr(err, "field 'partial_rotary_factor'"));
    /* malformed JSON: the parser's line and column */
    char *p = write_tmp("{\"hidden_size\": 1024,\n \"num_hidden_layers\": }\n");
    kvd_config c;
    assert_int_equal(kvd_config_load(p, &c, err), -1);
    assert_non_null(strstr(err, p));
    assert_non_null(strstr(err, "line 2"));
    unlink(p);
    assert_int_equal(kvd_config_load("/nonexistent/config.json", &c, err), -1);
    assert_non_null(strstr(err, "/nonexistent/config.json"));
}

static void hf_nesting(void **st) {
    (void)st;
    /* Qwen3.5 checkpoints nest the language model in text_config and newer
     * transformers keep RoPE settings in rope_parameters */
    char *p = write_tmp(
        "{\"text_config\": {\"hidden_size\": 256, \"num_hidden_layers\": 4, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, "
        "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"vocab_size\": 1000, "
        "\"rope_parameters\": {\"rope_theta\": 5000000, \"partial_rotary_factor\": 0.5}}}");
    kvd_config c;
    char err[KVD_ERR_LEN];
    assert_int_equal(kvd_config_load(p, &c, err), 0);
    unlink(p);
    assert_int_equal(c.hidden_size, 256);
    assert_true(c.rope_theta == 5e6);
    assert_int_equal(kvd_rot_dim(&c), 32);
    assert_int_equal(kvd_config_n_full(&c), 1);
    assert_int_equal(c.layer_types[3], KVD_LAYER_FULL);
}

/* A decode step's bytes for tiny, counted by hand from its shapes (hidden
 * 128; 2 attention layers of 4 x 64 query and 2 x 64 KV heads; 6 DeltaNet
 * layers of 2 x 32 key and 4 x 32 value heads, conv kernel 4; 8 MoE layers
 * of 8 experts, top 2, 64 wide, a shared expert 64 wide; vocabulary 512):
 * dense 2 x 131072 + 6 x 66560 + 8 x 25728 + 65536 + 128 C elements of two
 * bytes; experts 8 x 8 (1 - (3/4)^C) x 24576 elements of two bytes; state 6
 * x (4096 + 768) floats per sequence, read and written. */
static void near(double got, double want) {
    if (!(fabs(got - want) <= 1e-9 * want)) fail_msg("got %.1f, expected %.1f", got, want);
}
static void step_bytes(void **st) {
    (void)st;
    kvd_config c;
    char err[KVD_ERR_LEN];
    kvd_step_bytes b;
    assert_int_equal(kvd_config_preset("tiny", &c, err), 0);
    kvd_decode_step_bytes(&c, 1, 100, 1024, &b);
    near(b.dense, 1865984), near(b.experts, 786432), near(b.cache, 102400), near(b.state, 233472);
    kvd_decode_step_bytes(&c, 4, 100, 1024, &b);
    near(b.dense, 1866752), near(b.experts, 2150400), near(b.cache, 409600), near(b.state, 933888);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(step_bytes), cmocka_unit_test(presets),    cmocka_unit_test(round_trip),
        cmocka_unit_test(refusals),   cmocka_unit_test(hf_nesting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
