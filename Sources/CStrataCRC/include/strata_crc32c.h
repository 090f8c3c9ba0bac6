#ifndef STRATA_CRC32C_H
#define STRATA_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/// Whether this processor has a CRC-32C instruction that strata_crc32c_update uses
/// (SSE4.2 `crc32` on x86-64, the CRC32 extension's `crc32c*` on 64-bit Arm).
int strata_crc32c_available(void);

/// Continues the raw (not finally inverted) CRC-32C `crc` over `count` bytes at `bytes`, with
/// the processor's instruction. Call only when strata_crc32c_available() returned nonzero.
uint32_t strata_crc32c_update(uint32_t crc, const void *bytes, size_t count);

#endif
