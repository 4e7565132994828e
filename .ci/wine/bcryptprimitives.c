/* CI only, never shipped: wine 8 has no bcryptprimitives.dll, whose
 * ProcessPrng Rust's std calls for random bytes (HashMap keys). This
 * stand-in fills the buffer from RtlGenRandom (advapi32's SystemFunction036),
 * which wine implements. Built by .ci/run with mingw-w64 and copied next to
 * the Windows executables that run under wine. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG part = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, part))
            return FALSE;
        data += part;
        length -= part;
    }
    return TRUE;
}
