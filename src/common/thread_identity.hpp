// A number that names the calling thread for as long as it runs: its thread
// pointer (%fs:0 on x86-64, tpidr_el0 on arm64). Reading it is one load with
// no TLS model involved, so a library that uses it can still be dlopen()ed
// once the static TLS surplus is gone (an initial-exec thread_local cannot).
// A later thread may get the same number after this one exits.
#pragma once

#include <cstdint>

namespace softhca {

inline uintptr_t current_thread() { return reinterpret_cast<uintptr_t>(__builtin_thread_pointer()); }

}  // namespace softhca
