// Zero-filled output buffers without writing them: the KV page pool.
//
// An XLA program that returns jnp.zeros of the pool writes every byte of it
// (2 GiB on the CPU by default: about 0.8 CPU seconds at every start). This
// handler returns its output buffer zeroed the way calloc does: it writes the
// partial pages at either end and gives the whole pages between back to the
// kernel (madvise MADV_DONTNEED), after which they read as zeros and cost
// nothing until first written. XLA's allocations are private anonymous memory,
// for which Linux guarantees those zero pages; the handler checks the first and
// last whole page and falls back to memset should they not read as zeros.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

bool AllZero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// Zeroes [p, p + n).
void ZeroRange(char* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
  const uintptr_t lo = (b + page - 1) & ~(page - 1), hi = e & ~(page - 1);
  if (page == 0 || hi <= lo || hi - lo < 16 * page) {  // small: writing it is cheaper
    std::memset(p, 0, n);
    return;
  }
  std::memset(p, 0, lo - b);
  std::memset(reinterpret_cast<char*>(hi), 0, e - hi);
  char* mid = reinterpret_cast<char*>(lo);
  if (madvise(mid, hi - lo, MADV_DONTNEED) != 0 || !AllZero(mid, page) ||
      !AllZero(reinterpret_cast<char*>(hi - page), page))
    std::memset(mid, 0, hi - lo);
}

ffi::Error ZeroPagesImpl(ffi::Result<ffi::AnyBuffer> out) {
  ZeroRange(static_cast<char*>(out->untyped_data()), out->size_bytes());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedjaxZeroPages, ZeroPagesImpl,
                              ffi::Ffi::Bind().Ret<ffi::AnyBuffer>());

// Run once in a child process right after a build (kernels_pallas/cpu/build.py): 0 = fine.
extern "C" int PagedjaxSelfTest() {
  const size_t n = (size_t(1) << 22) + 123;  // whole pages and partial ends
  char* buf = static_cast<char*>(std::malloc(n + 64));
  if (buf == nullptr) return 1;
  int bad = 0;
  for (size_t off : {size_t(0), size_t(7), size_t(64)}) {
    std::memset(buf, 0x5a, n + 64);
    ZeroRange(buf + off, n - off);
    bad |= !AllZero(buf + off, n - off);
    bad |= off > 0 && buf[off - 1] != 0x5a;  // nothing outside the range
    bad |= buf[n] != 0x5a;
  }
  std::free(buf);
  return bad;
}
