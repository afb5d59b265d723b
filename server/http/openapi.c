/* openapi.c - server/http/openapi.json, the OpenAPI 3 description of every
 * route, embedded in the binary at build time (GET /openapi.json). */
#include <stddef.h>

__asm__(".section .rodata\n"
        ".global attnd_openapi_json\n"
        ".type attnd_openapi_json, @object\n"
        ".balign 16\n"
        "attnd_openapi_json:\n"
        ".incbin \"server/http/openapi.json\"\n"
        "attnd_openapi_json_end:\n"
        ".byte 0\n"
        ".global attnd_openapi_json_len\n"
        ".type attnd_openapi_json_len, @object\n"
        ".balign 8\n"
        "attnd_openapi_json_len:\n"
        ".quad attnd_openapi_json_end - attnd_openapi_json\n"
        ".previous\n");
