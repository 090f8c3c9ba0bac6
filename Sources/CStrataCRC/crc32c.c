// CRC-32C with the processor's own instruction, for the log's record checksums. The Swift side
// (Sources/Strata/Log/CRC32C.swift) keeps a table-driven version for processors without it and
// checks the two against each other in its tests. C, because Swift has no portable way to emit
// these instructions.
#include "strata_crc32c.h"
#include <string.h>

#if defined(__x86_64__)

int strata_crc32c_available(void) {
    return __builtin_cpu_supports("sse4.2");
}

__attribute__((target("sse4.2")))
uint32_t strata_crc32c_update(uint32_t crc, const void *bytes, size_t count) {
    const unsigned char *p = bytes;
    uint64_t c = crc;
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);  // unaligned load; the instruction takes little-endian words
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        count -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (count > 0) {
        c32 = __builtin_ia32_crc32qi(c32, *p);
        p += 1;
        count -= 1;
    }
    return c32;
}

#elif defined(__aarch64__)

#if defined(__APPLE__)
int strata_crc32c_available(void) { return 1; }  // every Apple arm64 processor has CRC32
#elif defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
int strata_crc32c_available(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#else
int strata_crc32c_available(void) { return 0; }
#endif

__attribute__((target("crc")))
uint32_t strata_crc32c_update(uint32_t crc, const void *bytes, size_t count) {
    const unsigned char *p = bytes;
    while (count >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        crc = __builtin_arm_crc32cd(crc, word);
        p += 8;
        count -= 8;
    }
    while (count > 0) {
        crc = __builtin_arm_crc32cb(crc, *p);
        p += 1;
        count -= 1;
    }
    return crc;
}

#else

int strata_crc32c_available(void) { return 0; }

uint32_t strata_crc32c_update(uint32_t crc, const void *bytes, size_t count) {
    (void)bytes;
    (void)count;
    return crc;  // never called: strata_crc32c_available() is 0
}

#endif
