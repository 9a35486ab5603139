/* Test hooks: functions the Check suites (tests/) call that are not public
 * API. They are hidden in libctpu.so (built with -fvisibility=hidden, see
 * include/ctpu.h's CTPU_API), so tests link the static library
 * (ctpu_internal_dep in src/meson.build). A new hook is declared here, never
 * in include/, and defined in the layer it inspects. */
#ifndef CTPU_TESTING_H
#define CTPU_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ctpu_cache ctpu_cache;

/* autograd.c: record every op and view reaching ctpu__ag_record on this
 * thread (op, dtype, arity, a hash of the output shape) into buf, up to cap
 * entries; buf NULL stops. _len: entries recorded so far. */
void ctpu__test_op_trace(uint64_t *buf, size_t cap);
size_t ctpu__test_op_trace_len(void);

/* dispatch.c: op's shape rule and dtype rule (its row's ids) have a
 * function in dispatch's rule tables. */
bool ctpu__test_op_rules_defined(int op);

/* runtime.c: hold (true) or release (false) the device thread, so commands
 * queue up behind it. */
void ctpu__test_device_hold(bool hold);
/* runtime.c: threads inside a guarded call (ctpu__call_enter: a compiled
 * call, backward, sync, a host read) right now. */
int ctpu__test_calls_busy(void);
/* runtime.c / defer.c: the strict program table and the fused-program cache
 * of the running runtime (NULL before init). */
ctpu_cache *ctpu__test_strict_cache(void);
ctpu_cache *ctpu__test_fused_cache(void);
/* fuse/cache.c: a cache's entry count; the hash collisions its lookups met
 * (a matching hash whose full key differed); force every key's hash to
 * `value` (on) or back to xxHash (off). */
size_t ctpu_cache_entries(ctpu_cache *c);
uint64_t ctpu_cache_collisions(ctpu_cache *c);
void ctpu_cache_force_hash(ctpu_cache *c, bool on, uint64_t value);

/* defer.c: a compiled step's capture length limit in ops (0: the default,
 * 1,000,000), past which the capture has a graph break. */
void ctpu__test_capture_limit(uint32_t n);

/* fuse/vm.c: run fused elementwise groups as block kernels, one
 * instruction at a time over each block (off: false), instead of their
 * register-resident tape (on: true, the default); the bits are the same. */
void ctpu__test_vm_tape(bool on);

/* nn/optim.c: in strict eager, run every optimizer's update as its one
 * compiled step (on: true, the default) or op by op (off: false); the bits
 * are the same. */
void ctpu__test_optim_fused(bool on);

#endif
