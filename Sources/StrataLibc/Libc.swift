// The C library of the platform, under one name: a file that needs POSIX calls (pthread, mmap,
// signals, file sizes) imports `StrataLibc` instead of repeating which module holds them where.
// Internal to the package (no product names it), and imported without `@_exported` by the
// modules that use it, so their clients see no more of the C library than before.
#if canImport(Glibc)
@_exported import Glibc
#elseif canImport(Musl)
@_exported import Musl
#elseif canImport(Darwin)
@_exported import Darwin
#else
#error("StrataLibc: no C library module (Glibc, Musl or Darwin) on this platform")
#endif
