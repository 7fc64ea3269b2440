/* kvdrift: text buffer (see buf.h). */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reserve(kvd_buf *b, size_t more) {
    if (b->n + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1) cap *= 2;
    b->s = realloc(b->s, cap);
    b->cap = cap;
}

void kvd_buf_printf(kvd_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void kvd_buf_puts(kvd_buf *b, const char *s) {
    size_t n = strlen(s);
    reserve(b, n);
    memcpy(b->s + b->n, s, n + 1);
    b->n += n;
}

void kvd_buf_xml(kvd_buf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&':
            kvd_buf_puts(b, "&amp;");
            break;
        case '<':
            kvd_buf_puts(b, "&lt;");
            break;
        case '>':
            kvd_buf_puts(b, "&gt;");
            break;
        case '"':
            kvd_buf_puts(b, "&quot;");
            break;
        default: {
            char c[2] = {*s, 0};
            kvd_buf_puts(b, c);
        }
        }
    }
}

void kvd_buf_free(kvd_buf *b) {
    free(b->s);
    b->s = NULL;
    b->n = b->cap = 0;
}
