/* kvdrift: a growing text buffer for the renderers, with XML escaping. */
#ifndef KVD_BUF_H
#define KVD_BUF_H

#include <stddef.h>

typedef struct {
    char *s;
    size_t n, cap;
} kvd_buf;

void kvd_buf_printf(kvd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvd_buf_puts(kvd_buf *b, const char *s);
/* Append s with &, <, >, " escaped. */
void kvd_buf_xml(kvd_buf *b, const char *s);
void kvd_buf_free(kvd_buf *b);

#endif
