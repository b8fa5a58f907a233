// Clang's thread-safety annotations
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html): they say, where a
// lock and its data are declared, which lock guards which member and which
// locks a function needs, acquires or releases. A clang build with
// -Wthread-safety checks every access and call against them
// (tools/check-thread-safety.sh); for other compilers they are no-ops.
//
// The lock types they work with are in mutex.h (std::mutex and
// std::shared_mutex are not annotated in libstdc++).
#pragma once

#if defined(__clang__) && !defined(SWIG)
#define SPILLFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SPILLFS_THREAD_ANNOTATION(x)
#endif

// A type that is a lock ("capability"), and a type that holds one for its
// scope.
#ifndef CAPABILITY
#define CAPABILITY(x) SPILLFS_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY SPILLFS_THREAD_ANNOTATION(scoped_lockable)
#endif

// A member read or written only with the lock held (shared for reads).
#ifndef GUARDED_BY
#define GUARDED_BY(x) SPILLFS_THREAD_ANNOTATION(guarded_by(x))
#endif
// The data a pointer member points to is guarded by the lock.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) SPILLFS_THREAD_ANNOTATION(pt_guarded_by(x))
#endif

// Lock order between locks declared in one class (documentation: clang
// checks these only in part).
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) SPILLFS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) SPILLFS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#endif

// The caller must hold the locks (exclusively, or at least shared).
#ifndef REQUIRES
#define REQUIRES(...) SPILLFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef REQUIRES_SHARED
#define REQUIRES_SHARED(...) SPILLFS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#endif
#ifndef EXCLUSIVE_LOCKS_REQUIRED
#define EXCLUSIVE_LOCKS_REQUIRED(...) REQUIRES(__VA_ARGS__)
#endif
#ifndef SHARED_LOCKS_REQUIRED
#define SHARED_LOCKS_REQUIRED(...) REQUIRES_SHARED(__VA_ARGS__)
#endif

// The function takes or gives back the locks (no argument: `this`).
#ifndef ACQUIRE
#define ACQUIRE(...) SPILLFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef ACQUIRE_SHARED
#define ACQUIRE_SHARED(...) SPILLFS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) SPILLFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef RELEASE_SHARED
#define RELEASE_SHARED(...) SPILLFS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#endif
#ifndef RELEASE_GENERIC
#define RELEASE_GENERIC(...) SPILLFS_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#endif
// Takes the lock when it returns `x` (true or false).
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) SPILLFS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#endif
#ifndef TRY_ACQUIRE_SHARED
#define TRY_ACQUIRE_SHARED(...) SPILLFS_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))
#endif

// The caller must not hold the locks (the function takes them).
#ifndef EXCLUDES
#define EXCLUDES(...) SPILLFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef LOCKS_EXCLUDED
#define LOCKS_EXCLUDED(...) EXCLUDES(__VA_ARGS__)
#endif

// Checks at run time (or promises) that the lock is held.
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) SPILLFS_THREAD_ANNOTATION(assert_capability(x))
#endif
#ifndef ASSERT_SHARED_CAPABILITY
#define ASSERT_SHARED_CAPABILITY(x) SPILLFS_THREAD_ANNOTATION(assert_shared_capability(x))
#endif

// The function returns (a reference to) the lock `x`.
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) SPILLFS_THREAD_ANNOTATION(lock_returned(x))
#endif

// Turns the analysis off for one function: for locking it cannot follow
// (a lock taken or not depending on a flag, or handed between functions).
// Say why beside each use.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS SPILLFS_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif
