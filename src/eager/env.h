/* The environment variables ctpu_init reads, declared once.
 *
 * X(name, kind, default, doc): `kind` picks the parser and its checks
 * (runtime.c, read_env; DIST: src/dist reads it at ctpu_dist_init); `default` and `doc` are the two text columns of
 * the tables in README.md ("Environment variables") and docs/DESIGN.md,
 * which tests/test_env.c checks row for row against this list. A new
 * variable is one row here plus its line in read_env, and the two tables.
 *
 * Besides these, ctpu_init looks at every variable whose name starts with
 * TORCH_TPU_ or CTPU_: an unknown one gets one warning on stderr naming the
 * closest known name, a TorchTPU variable ctpu does not implement (below)
 * one saying it has no effect; CTPU_TEST_ and CTPU_BENCH_ are reserved for
 * the project's own tests and benchmarks and never warned about. */
#ifndef CTPU_EAGER_ENV_H
#define CTPU_EAGER_ENV_H

#define CTPU_ENV_VARS(X)                                                                                          \
    X(TORCH_TPU_DEFER_AND_FUSE, BOOL, "0", "defer and fuse")                                                        \
    X(TORCH_TPU_LAUNCH_BLOCKING, BOOL, "0", "debug eager (wins over the above)")                                    \
    X(TORCH_TPU_ENABLE_DEBUG_CHECKS, BOOL, "on in debug eager",                                                     \
      "an op that makes a NaN from inputs without NaN or Inf is an error naming it (CONTRACTS.md)")                               \
    X(TORCH_TPU_DETECT_LOOPS, LOOPS, "`auto`",                                                                      \
      "loop detector: `auto` = on until the program first marks a step itself; `on`; `off`")                      \
    X(TORCH_TPU_CHIP, CHIP, "`v5e`", "emulated chip: `v5e`, `v5p`, `v6e`, `7x`")                                     \
    X(TORCH_TPU_HBM_LIMIT, BYTES, "min(chip's HBM, RAM/2) (÷ local ranks under `ctpu_dist_init`)",                  \
      "device memory cap, bytes (suffixes K/M/G/T)")                                                               \
    X(TORCH_TPU_MATMUL_PRECISION, PRECISION, "`default`", "`default` / `high` / `highest` (1, 3, 6 bf16 passes)")   \
    X(TORCH_TPU_CACHE_SIZE, ENTRIES, "1024",                                                                        \
      "fused-program cache capacity (entries); LRU beyond it. Strict eager's one-node programs have their own "     \
      "table and never evict fused programs")                                                                      \
    X(TORCH_TPU_RECOMPILE_LIMIT, LIMIT, "8",                                                                        \
      "distinct shapes one program structure (the key without extents) compiles for, evicted ones included "        \
      "(torch.compile's cache size limit); a trace of that structure in a new shape then runs op by op in strict "  \
      "eager, with one warning. `0`: no limit")                                                                    \
    X(CTPU_STRICT_CACHE_SIZE, ENTRIES, "4096",                                                                      \
      "strict eager's one-op program table capacity (entries, about 10 KiB each); LRU beyond it")                  \
    X(TORCH_TPU_CACHE_ONLY, STEPS, "unset",                                                                         \
      "`N`: after N marked steps, a fused-cache miss is an error (as `ctpu_cache_set_only(true)` does from the "    \
      "moment it is called)")                                                                                      \
    X(TORCH_TPU_METRICS_FILE, PATH, "unset",                                                                        \
      "write the metrics as JSON at shutdown (`ctpu_init` checks that its directory exists and is writable, and " \
      "refuses a path on a kernel pseudo-filesystem such as /proc or /sys, where the write would fail)")            \
    X(TORCH_TPU_TRACE_FILE, PATH, "unset",                                                                          \
      "write a Chrome/Perfetto trace at shutdown (`ctpu_init` checks its directory the same way)")                 \
    X(TORCH_TPU_TRACE_EVENTS, EVENTS, "65536",                                                                      \
      "trace buffer capacity in events, [16, 16777216] (suffixes K/M); drops are counted and reported with the "    \
      "size that keeps them")                                                                                      \
    X(TORCH_TPU_PRICE_PLAN, PLAN, "`on_demand`",                                                                    \
      "the Cloud TPU price plan of the cost table: `on_demand`, `flex_start`, `1y`, `3y`")                         \
    X(TORCH_TPU_COMPILE_SECONDS, SECONDS, "30",                                                                    \
      "assumed seconds of chip time per XLA compile on a real TPU, for the cache report's shape policies (an "      \
      "assumption: set it from a real run's compile times); a number >= 0")                                        \
    X(TORCH_TPU_AUTO_DYNAMIC, BOOL, "0",                                                                           \
      "`1`: automatic dynamic dims (torch.compile's): a structure's first recompile caused only by one dim's "    \
      "extent compiles the dynamic program itself, with that dim of the inputs it maps to dynamic over "           \
      "[2, 2^31-1], and later traces of that structure mark it too (`ctpu_mark_dynamic`'s mechanism; the state "    \
      "is per structure, as torch.compile's per frame, so traces of other structures in between do not matter): "  \
      "two compiles for any number of extents, as torch.compile (in defer and fuse only when the dim maps to a "   \
      "trace input: a trace that makes its values from a host shape, such as `ctpu_rand_normal` of [B, 4], has "   \
      "no input dim to mark and compiles once per extent until the recompile limit); the cache report says "       \
      "which dims and at which "                                                                                    \
      "step; a compiled step's guard failure on one dim's extent alone recaptures it with that dim dynamic "      \
      "too (README \"Compiled steps\")")                                                                                                       \
    X(TORCH_COMPILE_DISABLE, BOOL, "0",                                                                             \
      "`1`: every `ctpu_compiled_call` runs its step function in the current mode (PyTorch's switch, for debugging)") \
    X(CTPU_QUIET, BOOL, "0",                                                                                        \
      "`1`: no compile-cache summary line and no leak line (handles left to `ctpu_shutdown`) on stderr at "        \
      "shutdown (warnings stay)")                                                                                  \
    X(CTPU_ISA, ISA, "best", "force a kernel variant: `scalar`, `avx2`, `avx512`")                                  \
    X(CTPU_NUM_THREADS, THREADS, "cores (÷ local ranks under `ctpu_dist_init`)",                                     \
      "kernel threads, the device thread included")                                                                \
    X(CTPU_DIST_TIMEOUT, DIST, "300",                                                                               \
      "seconds a rank waits in a collective before `MPI_Abort` naming it (read by `ctpu_dist_init`)")

typedef enum {
#define CTPU_ENV_ID_(name, kind, dflt, doc) CTPU_ENV_##name,
    CTPU_ENV_VARS(CTPU_ENV_ID_)
#undef CTPU_ENV_ID_
    CTPU_ENV_COUNT
} ctpu_env_id;

/* The prefixes ctpu_init checks names under, and the reserved ones. */
#define CTPU_ENV_PREFIXES "TORCH_TPU_", "CTPU_"
#define CTPU_ENV_RESERVED "CTPU_TEST_", "CTPU_BENCH_"

/* TorchTPU variables (its source's env_vars.h, its launchers, its vLLM
 * plugin) that ctpu does not implement: set, they get "has no effect in
 * ctpu" instead of a "did you mean". A name ending in '*' is a prefix. */
#define CTPU_ENV_TORCHTPU_ONLY                                                                               \
    "TORCH_TPU_INTERNAL_*", "TORCH_TPU_TIER2_COMPILATION_CACHE", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", \
        "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID",             \
        "TORCH_TPU_DP_SIZE"

#endif
