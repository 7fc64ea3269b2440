/* kvdrift: atomic writes (temp file + fsync + rename) and small file helpers. */
#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

static char tmp_now[4200];
static volatile sig_atomic_t tmp_active = 0;

void kvd_tmp_set(const char *tmp_path) {
    tmp_active = 0;
    if (tmp_path) {
        snprintf(tmp_now, sizeof tmp_now, "%s", tmp_path);
        tmp_active = 1;
    }
}

static void on_signal(int sig) {
    if (tmp_active) unlink(tmp_now); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

void kvd_tmp_guard(void) {
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
}

void kvd_tmp_sweep(const char *out_path) {
    char dir[4096], pre[4096];
    const char *slash = strrchr(out_path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out_path) : 1, slash ? out_path : ".");
    snprintf(pre, sizeof pre, "%s.tmp.", slash ? slash + 1 : out_path);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, pre, strlen(pre)) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + strlen(pre), &end, 10);
        if (*end || pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            char p[8300];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

void kvd_atomic_begin(const char *path, char *tmp, size_t n) {
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    kvd_tmp_set(tmp);
}

int kvd_atomic_end(const char *tmp, const char *path, int ok, char *err) {
    int e = ok ? 0 : EIO;
    if (!e && rename(tmp, path) != 0) e = errno;
    kvd_tmp_set(NULL);
    if (e) {
        unlink(tmp);
        snprintf(err, KVD_ERR_LEN, "%s: write failed: %s", path, strerror(e));
        return -1;
    }
    return 0;
}

/* Whether path is an HDF5 file (its signature at offset 0, where kvdrift's
 * results and trace sets have it). */
static int is_hdf5(const char *path) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    return n == sizeof head && !memcmp(head, sig, sizeof sig);
}

int kvd_output_check(const char *path, char *err) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, KVD_ERR_LEN, "%s: a directory: expected a file name", path);
        return -1;
    }
    /* these writers make JSON, HTML, CSV, safetensors and raw dumps, never
     * HDF5: an HDF5 file where one would go is a sweep's results or a trace
     * set named by mistake (`report run.h5 -o run.h5`), not to be replaced */
    if (is_hdf5(path)) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: an HDF5 file (results or traces?) is there, and this output is not one: "
                 "choose another name",
                 path);
        return -1;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1,
             slash ? path : ".");
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot create: %s (directory %s)", path, strerror(errno),
                 dir);
        return -1;
    }
    return 0;
}

int kvd_afile_open(kvd_afile *a, const char *path, char *err) {
    memset(a, 0, sizeof *a);
    if (kvd_output_check(path, err)) return -1;
    snprintf(a->path, sizeof a->path, "%s", path);
    snprintf(a->tmp, sizeof a->tmp, "%s.tmp.%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "wb");
    if (a->f) kvd_tmp_set(a->tmp);
    if (!a->f) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int kvd_afile_write(kvd_afile *a, const void *p, size_t n) {
    if (a->failed) return -1;
    if (n && fwrite(p, 1, n, a->f) != n) a->failed = errno ? errno : EIO;
    return a->failed ? -1 : 0;
}

int kvd_afile_commit(kvd_afile *a, char *err) {
    int e = a->failed;
    if (!e && fflush(a->f) != 0) e = errno;
    if (!e && fsync(fileno(a->f)) != 0) e = errno;
    if (fclose(a->f) != 0 && !e) e = errno;
    a->f = NULL;
    if (e) {
        kvd_tmp_set(NULL);
        unlink(a->tmp);
        snprintf(err, KVD_ERR_LEN, "%s: write failed: %s", a->path, strerror(e));
        return -1;
    }
    return kvd_atomic_end(a->tmp, a->path, 1, err);
}

void kvd_afile_abort(kvd_afile *a) {
    if (a->f) fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
    kvd_tmp_set(NULL);
}

int kvd_write_file_atomic(const char *path, const void *data, size_t n, char *err) {
    kvd_afile a;
    if (kvd_afile_open(&a, path, err)) return -1;
    kvd_afile_write(&a, data, n);
    return kvd_afile_commit(&a, err);
}

char *kvd_read_file(const char *path, size_t *n, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        snprintf(err, KVD_ERR_LEN, "%s: read failed", path);
        return NULL;
    }
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

int kvd_mkdirs(const char *path, char *err) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST) goto fail;
        *p = '/';
    }
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) goto fail;
    return 0;
fail:
    snprintf(err, KVD_ERR_LEN, "%s: cannot create directory: %s", tmp, strerror(errno));
    return -1;
}
