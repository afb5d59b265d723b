/* utf8.c - UTF-8 checking and JSON string escaping (see utf8.h): whatever
 * bytes a client sent, what attnd writes back is valid JSON. */
#include "utf8.h"

#include <string.h>

size_t attnd_utf8_seq_len(const unsigned char *s, const unsigned char *end) {
    unsigned c = s[0];
    size_t n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) < n) return 0;
    unsigned cp = c & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

size_t attnd_utf8_put(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

void attnd_sb_json_str(attnd_sbuf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    const unsigned char *end = p + strlen(s);
    attnd_sb_putc(b, '"');
    while (p < end) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            attnd_sb_putc(b, '\\');
            attnd_sb_putc(b, (char)c);
            p++;
        } else if (c == '\n') {
            attnd_sb_puts(b, "\\n");
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            attnd_sb_put(b, e, 6);
            p++;
        } else if (c < 0x80) {
            attnd_sb_putc(b, (char)c);
            p++;
        } else {
            size_t n = attnd_utf8_seq_len(p, end);
            if (n) {
                attnd_sb_put(b, p, n);
                p += n;
            } else {
                attnd_sb_puts(b, "\\ufffd");
                p++;
            }
        }
    }
    attnd_sb_putc(b, '"');
}
