/* A char-level GPT trained on the Debian fortunes corpus, in C (issue 14).
 *
 * Data (examples/corpus.h): --data PATH, a file or a directory (default
 * /usr/share/games/fortunes, Debian's fortunes and fortunes-min); byte
 * tokens, every byte kept (control characters such as BEL and backspace
 * overstrikes are ordinary tokens; the sample prints them escaped); fortune
 * i is validation when i % 10 == 9; the vocabulary is the training split's
 * bytes plus one id for unseen bytes.
 *
 * Model: token and position embeddings, --layers pre-norm blocks (causal
 * self-attention, one ctpu_scaled_dot_product_attention_bthd (is_causal, scale
 * 1/sqrt(head_dim), --dropout on the probabilities), then a GELU (erf) MLP
 * of 4 x dmodel), a final layer norm and a head tied to the token
 * embedding. q, k and v
 * project to heads x head_dim (default dmodel / heads). Every linear layer
 * has a bias. Initialisation as nanoGPT: weights and embeddings N(0, 0.02),
 * the two projections that write into the residual stream (attention output,
 * MLP output) N(0, 0.02 / sqrt(2 layers)), biases 0, layer norms 1 / 0.
 * AdamW (betas 0.9 / 0.95, eps 1e-8) with two groups: the 2-D weights and
 * embeddings decay (--wd, default 0.1), biases and norms do not; learning
 * rate: ctpu_lr_warmup_cosine (--warmup steps, default min(100, steps / 10),
 * then cosine to lr / 10 at --steps). --dtype bf16: the forward (and so the
 * backward) runs on bf16 copies of the f32 parameters (one ctpu_cast each
 * per step; the tied embedding cast once) with bf16 activations; the
 * gradients reach the f32 parameters through the casts, and AdamW updates
 * those f32 master weights. Layer norms and the loss compute in f32 inside.
 *
 * Batch sampler (fixed, so another implementation can draw the same
 * batches): row b of training step s starts at
 *   splitmix64(seed + 0x9E3779B97F4A7C15 * (1 + s * batch + b)) % (n - ctx)
 * in the training tokens (n of them), x = tokens[start, start + ctx),
 * y = tokens[start + 1, start + ctx + 1); evaluation batch e (of
 * --eval-batches, the same ones at every evaluation) uses s = 2^40 + e over
 * the validation tokens. splitmix64 is Steele, Lea and Flood's finaliser
 * (z += 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
 * z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^ z >> 31). --by-document:
 * examples/docbatch.h's batches of whole fortunes (training: stream 1, step
 * s; evaluation batch e: stream 2, step e), padded, the padding's targets
 * ignore_index; the training tokens/s then counts real (unpadded) tokens.
 *
 * Output: every --eval-every steps (and after the last) a line with the
 * step, the mean train loss of the interval, the val loss, val bits per
 * character (val loss / ln 2) and training tokens/s; then
 *   result val_loss=V train_loss=L steps=N tokens_per_s=R compiles=C recompiles=K mode=M
 * (compiles: the programs compiled for the training and evaluation steps up
 * to that line, not those that made or loaded the model: fused programs in
 * defer and fuse, one-op programs in strict and debug; recompiles: those of
 * them that compile an operation again for new shapes: fused programs
 * whose structure (the key without extents) was cached with other shapes,
 * the counter "recompiles", plus one-op programs whose op signature was
 * first compiled in an earlier step, "strict_recompiles" (README "The
 * char-level GPT demo"); a run of fixed shapes has 0 in every mode,
 * --by-document's varying T has some), then the generated sample (see
 * generate()) and the cache report on stderr. --log FILE writes step,lr,train_loss,val_loss
 * (val_loss empty between evaluations), %.9g, no timing: logs of different
 * modes compare with cmp.
 *
 * Checkpoints: --save PATH writes the whole run at the end (and, with
 * --save-every K, after every K steps): the parameters (named as the model,
 * "wte", "h.0.attn.wq", ...), the AdamW state with its two parameter groups
 * and the generator's state (dropout), by ctpu_checkpoint_save, a
 * safetensors file. The batch sampler needs no state of its own: step s's
 * batch is a function of --seed and s, and s is the optimizer's step count;
 * the seed and what the loop carries between evaluations (the current
 * interval's train-loss sum and count, the last train and val loss) go in
 * the file's metadata as "char_gpt.*" strings (doubles %.17g, so they read
 * back bit for bit). --resume PATH continues such a run where it stopped
 * (same options needed; the shapes and the seed are checked), giving the
 * unbroken run's losses bit for bit; --stop-after N stops once N steps of
 * the run are done (the schedule still spans --steps), writing the log rows
 * of the unfinished interval (val_loss empty). The --log of a stopped run
 * followed by its resumed run's (headers aside) is the unbroken run's.
 *
 * Data parallel (issue 19): --ddp under mpirun, --batch the global batch,
 * rank r training rows [r b / N, (r+1) b / N); --grad-accum N, the same
 * micro-batches in one process, gives the same bits (see "data parallel"
 * below).
 */
#include "corpus.h"
#include "demo_util.h"
#include "docbatch.h"

#include <ctpu.h>
#include <ctpu_nn.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_LAYERS 64

typedef struct {
    const char *data, *log_path, *save_path, *resume_path;
    int64_t save_every, stop_after;
    int64_t layers, heads, dmodel, head_dim, ctx, batch, steps, warmup, eval_every, eval_batches;
    int64_t sample_len;
    double lr, wd, dropout, temperature;
    uint64_t seed;
    int threads, progress;
    bool by_doc, warmup_given, compile, capturable, dynamic;
    bool ddp;              /* data parallel over mpirun's ranks (data_parallel_step) */
    int64_t grad_accum;    /* micro-batches per step in one process (1: none) */
    ctpu_dtype dtype;
    const char *prompt;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: char_gpt [options]\n"
            "Train a char-level GPT on the fortunes corpus with AdamW (warmup + cosine).\n"
            "  --data PATH       a fortunes file or directory (default /usr/share/games/fortunes)\n"
            "  --layers N        transformer blocks (default 4)\n"
            "  --heads N         attention heads (default 4)\n"
            "  --dmodel N        model width (default 128)\n"
            "  --head-dim N      q/k/v width per head (default dmodel / heads)\n"
            "  --ctx N           context length (default 128)\n"
            "  --batch N         sequences per step (default 32)\n"
            "  --steps N         optimizer steps (default 1000)\n"
            "  --lr X            peak learning rate (default 1e-3; cosine to lr/10)\n"
            "  --warmup N        linear warmup steps (default 100, or steps / 10 if that is less)\n"
            "  --wd X            weight decay of the 2-D weights (default 0.1)\n"
            "  --dropout P       dropout after attention, projections and embeddings (default 0)\n"
            "  --seed N          initialisation, dropout and batch seed (default 1)\n"
            "  --threads N       kernel threads (sets CTPU_NUM_THREADS)\n"
            "  --eval-every N    evaluate every N steps (default 100)\n"
            "  --eval-batches N  validation batches per evaluation (default 8)\n"
            "  --log FILE        CSV step,lr,train_loss,val_loss\n"
            "  --save PATH       write a checkpoint (safetensors) of the whole run at the end\n"
            "  --save-every K    ... and after every K steps (needs --save)\n"
            "  --resume PATH     continue the run saved in PATH (same options)\n"
            "  --stop-after N    stop once N steps of the run are done (the schedule still spans --steps)\n"
            "  --dtype f32|bf16  parameters and activations (bf16: the optimizer keeps f32 master weights)\n"
            "  --by-document     batches of whole fortunes of similar length, padded (T varies in [2, ctx])\n"
            "  --dynamic         each batch's T dynamic in [2, ctx] (ctpu_declare_dynamic_inputs): one step program\n"
            "                    for every length in defer and fuse (with --by-document)\n"
            "  --sample N        bytes to generate after the result line (default 300; 0: none)\n"
            "  --temperature X   sampling temperature (default 0.8; 0: the most likely byte)\n"
            "  --prompt TEXT     the sample's start (default a newline)\n"
            "  --progress / --no-progress   progress bar on or off (default: on a terminal)\n"
            "  --compile         the training step as a compiled step (ctpu_compile: captured once,\n"
            "                    replayed with no per-op host work); implies --capturable\n"
            "  --capturable      AdamW keeps lr and step count as device tensors (torch's\n"
            "                    capturable=True; the numbers --compile gives, in any mode)\n"
            "  --ddp             data parallel: run under mpirun, one emulated chip per process;\n"
            "                    --batch stays the global batch (rank r takes rows [r b/N, (r+1) b/N))\n"
            "  --grad-accum N    one process, each batch as N micro-batches of those rows, gradients\n"
            "                    accumulated and divided by N (what --ddp over N ranks computes)\n"
            "  --help, --version\n"
            "The mode comes from the environment: TORCH_TPU_LAUNCH_BLOCKING=1 (debug eager),\n"
            "TORCH_TPU_DEFER_AND_FUSE=1 (defer and fuse); strict eager otherwise.\n"
            "Tokens are bytes, kept as they are: the corpus's control characters (BEL, the\n"
            "backspaces of overstruck text) are ordinary tokens the model learns; the sample\n"
            "prints control bytes other than newline and tab as \\a, \\b or \\xNN escapes.\n");
}

static bool parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

static bool pos_int(double x, double max) { return x >= 1 && x <= max && x == floor(x); }

static int data_parallel_args(const opts_t *o);

static int parse_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){ .data = "/usr/share/games/fortunes", .layers = 4, .heads = 4, .dmodel = 128, .ctx = 128,
                   .batch = 32, .steps = 1000, .warmup = 100, .eval_every = 100, .eval_batches = 8, .lr = 1e-3,
                   .wd = 0.1, .seed = 1, .progress = -1, .dtype = CTPU_F32, .sample_len = 300,
                   .temperature = 0.8, .prompt = "\n", .grad_accum = 1 };
    enum { O_DATA = 256, O_LOG, O_LAYERS, O_HEADS, O_DMODEL, O_HEAD_DIM, O_CTX, O_BATCH, O_STEPS, O_LR, O_WARMUP,
           O_WD, O_DROPOUT, O_SEED, O_THREADS, O_EVAL_EVERY, O_EVAL_BATCHES, O_DTYPE, O_BY_DOC, O_PROGRESS,
           O_NO_PROGRESS, O_VERSION, O_SAVE, O_SAVE_EVERY, O_RESUME, O_STOP_AFTER, O_SAMPLE, O_TEMPERATURE,
           O_PROMPT, O_COMPILE, O_CAPTURABLE, O_DDP, O_GRAD_ACCUM, O_DYNAMIC };
    static const struct option longopts[] = {
        { "data", required_argument, NULL, O_DATA },         { "log", required_argument, NULL, O_LOG },
        { "layers", required_argument, NULL, O_LAYERS },     { "heads", required_argument, NULL, O_HEADS },
        { "dmodel", required_argument, NULL, O_DMODEL },     { "head-dim", required_argument, NULL, O_HEAD_DIM },
        { "ctx", required_argument, NULL, O_CTX },           { "batch", required_argument, NULL, O_BATCH },
        { "steps", required_argument, NULL, O_STEPS },       { "lr", required_argument, NULL, O_LR },
        { "warmup", required_argument, NULL, O_WARMUP },     { "wd", required_argument, NULL, O_WD },
        { "dropout", required_argument, NULL, O_DROPOUT },   { "seed", required_argument, NULL, O_SEED },
        { "threads", required_argument, NULL, O_THREADS },   { "eval-every", required_argument, NULL, O_EVAL_EVERY },
        { "eval-batches", required_argument, NULL, O_EVAL_BATCHES }, { "dtype", required_argument, NULL, O_DTYPE },
        { "by-document", no_argument, NULL, O_BY_DOC },      { "progress", no_argument, NULL, O_PROGRESS },
        { "no-progress", no_argument, NULL, O_NO_PROGRESS }, { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, O_VERSION },         { "save", required_argument, NULL, O_SAVE },
        { "save-every", required_argument, NULL, O_SAVE_EVERY }, { "resume", required_argument, NULL, O_RESUME },
        { "stop-after", required_argument, NULL, O_STOP_AFTER }, { "sample", required_argument, NULL, O_SAMPLE },
        { "temperature", required_argument, NULL, O_TEMPERATURE }, { "prompt", required_argument, NULL, O_PROMPT },
        { "compile", no_argument, NULL, O_COMPILE },         { "capturable", no_argument, NULL, O_CAPTURABLE },
        { "ddp", no_argument, NULL, O_DDP },                 { "grad-accum", required_argument, NULL, O_GRAD_ACCUM },
        { "dynamic", no_argument, NULL, O_DYNAMIC },
        { NULL, 0, NULL, 0 },
    };
    opterr = 0;
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", longopts, &li)) != -1) {
        const char *name = li >= 0 ? longopts[li].name : "?";
        const char *v = optarg;
        double x = 0;
        bool ok = true;
        switch (c) {
        case 'h': usage(stdout); return 1;
        case O_VERSION: printf("char_gpt (ctpu %s)\n", ctpu_version()); return 1;
        case O_PROGRESS: o->progress = 1; break;
        case O_NO_PROGRESS: o->progress = 0; break;
        case O_DATA: o->data = v; break;
        case O_LOG: o->log_path = v; break;
        case O_SAVE: o->save_path = v; break;
        case O_RESUME: o->resume_path = v; break;
        case O_PROMPT:
            if (!*v || strlen(v) > 4096) ok = false;
            o->prompt = v;
            break;
        case O_DTYPE:
            if (strcmp(v, "f32") == 0) o->dtype = CTPU_F32;
            else if (strcmp(v, "bf16") == 0) o->dtype = CTPU_BF16;
            else ok = false;
            break;
        case O_BY_DOC: o->by_doc = true; break;
        case O_DYNAMIC: o->dynamic = true; break;
        case O_COMPILE: o->compile = o->capturable = true; break;
        case O_CAPTURABLE: o->capturable = true; break;
        case O_DDP: o->ddp = true; break;
        case ':': fprintf(stderr, "char_gpt: %s needs a value (see --help)\n", argv[optind - 1]); return 2;
        case '?': fprintf(stderr, "char_gpt: unknown option %s (see --help)\n", argv[optind - 1]); return 2;
        default:
            if (!(ok = parse_num(v, &x))) break;
            switch (c) {
            case O_LAYERS: o->layers = (int64_t)x; ok = pos_int(x, MAX_LAYERS); break;
            case O_HEADS: o->heads = (int64_t)x; ok = pos_int(x, 4096); break;
            case O_DMODEL: o->dmodel = (int64_t)x; ok = pos_int(x, 65536); break;
            case O_HEAD_DIM: o->head_dim = (int64_t)x; ok = pos_int(x, 65536); break;
            case O_CTX: o->ctx = (int64_t)x; ok = pos_int(x, 65536); break;
            case O_BATCH: o->batch = (int64_t)x; ok = pos_int(x, 65536); break;
            case O_STEPS: o->steps = (int64_t)x; ok = pos_int(x, 1e12); break;
            case O_WARMUP: o->warmup = (int64_t)x; o->warmup_given = true; ok = x >= 0 && x == floor(x) && x < 1e12; break;
            case O_SAMPLE: o->sample_len = (int64_t)x; ok = x >= 0 && x == floor(x) && x <= 1e7; break;
            case O_TEMPERATURE: o->temperature = x; ok = x >= 0 && x <= 100; break;
            case O_EVAL_EVERY: o->eval_every = (int64_t)x; ok = pos_int(x, 1e12); break;
            case O_EVAL_BATCHES: o->eval_batches = (int64_t)x; ok = pos_int(x, 1e6); break;
            case O_LR: o->lr = x; ok = x > 0 && isfinite(x); break;
            case O_WD: o->wd = x; ok = x >= 0 && isfinite(x); break;
            case O_DROPOUT: o->dropout = x; ok = x >= 0 && x < 1; break;
            case O_SEED: o->seed = (uint64_t)x; ok = x >= 0 && x < 1.8446744073709552e19; break;
            case O_THREADS: o->threads = (int)x; ok = pos_int(x, 64); break;
            case O_SAVE_EVERY: o->save_every = (int64_t)x; ok = pos_int(x, 1e12); break;
            case O_STOP_AFTER: o->stop_after = (int64_t)x; ok = pos_int(x, 1e12); break;
            case O_GRAD_ACCUM: o->grad_accum = (int64_t)x; ok = pos_int(x, 65536); break;
            default: ok = false; break;
            }
        }
        if (!ok) { fprintf(stderr, "char_gpt: bad value '%s' for --%s (see --help)\n", v, name); return 2; }
        li = -1;
    }
    if (optind < argc) { fprintf(stderr, "char_gpt: unexpected argument %s (see --help)\n", argv[optind]); return 2; }
    if (o->save_every && !o->save_path) {
        fprintf(stderr, "char_gpt: --save-every needs --save PATH (see --help)\n");
        return 2;
    }
    if (!o->warmup_given && o->warmup > o->steps / 10) o->warmup = o->steps / 10;
    if (data_parallel_args(o)) return 2;
    if (o->by_doc && o->ctx < 2) {
        fprintf(stderr, "char_gpt: --by-document needs --ctx 2 or more\n");
        return 2;
    }
    if (o->dynamic && !o->by_doc)
        fprintf(stderr, "char_gpt: note: --dynamic without --by-document: every batch (training, "
                        "evaluation and the sampling window) has T = --ctx, so the dynamic dim never varies\n");
    if (!o->head_dim) {
        if (o->dmodel % o->heads) {
            fprintf(stderr, "char_gpt: --dmodel %lld is not a multiple of --heads %lld (or give --head-dim)\n",
                    (long long)o->dmodel, (long long)o->heads);
            return 2;
        }
        o->head_dim = o->dmodel / o->heads;
    }
    return 0;
}

static double now_s(void) { return demo_now_s(); }
static int fail(const char *what) { return demo_fail("char_gpt", what); }

static uint64_t splitmix64(uint64_t z) { return docbatch_splitmix64(z); }

/* The batches of one split: the fixed-window sampler over its tokens, or
 * (--by-document) docbatch.h's batches of its fortunes. */
typedef struct {
    const int32_t *tok;
    int64_t n;
    bool by_doc;
    docbatch db;
    int32_t *hx, *hy;   /* [batch * ctx] host staging */
} batcher;

static int batcher_init(batcher *bt, const int32_t *tok, int64_t n, const int64_t *doc, int64_t n_docs,
                        const opts_t *o, uint64_t stream, char *err, int errlen)
{
    memset(bt, 0, sizeof *bt);
    bt->tok = tok, bt->n = n, bt->by_doc = o->by_doc;
    bt->hx = malloc(sizeof(int32_t) * (size_t)(o->batch * o->ctx));
    bt->hy = malloc(sizeof(int32_t) * (size_t)(o->batch * o->ctx));
    if (!bt->hx || !bt->hy) {
        snprintf(err, (size_t)errlen, "out of memory");
        return -1;
    }
    return o->by_doc ? docbatch_init(&bt->db, tok, doc, n_docs, o->batch, o->ctx, o->seed, stream, err, errlen) : 0;
}

static void batcher_free(batcher *bt)
{
    if (bt->by_doc) docbatch_free(&bt->db);
    free(bt->hx);
    free(bt->hy);
}

/* The batch of sampler step s: x, y [batch, T] i32 (T = ctx, or the
 * batch's length with --by-document); *real = its non-padding targets. */
static ctpu_status make_batch(batcher *bt, const opts_t *o, uint64_t s, ctpu_tensor *x, ctpu_tensor *y, int64_t *T,
                              int64_t *real)
{
    if (bt->by_doc) {
        *real = docbatch_get(&bt->db, (int64_t)s, bt->hx, bt->hy, T);
    } else {
        for (int64_t b = 0; b < o->batch; b++) {
            uint64_t start = splitmix64(o->seed + 0x9E3779B97F4A7C15ull * (1 + s * (uint64_t)o->batch + (uint64_t)b)) %
                             (uint64_t)(bt->n - o->ctx);
            memcpy(bt->hx + b * o->ctx, bt->tok + start, sizeof(int32_t) * (size_t)o->ctx);
            memcpy(bt->hy + b * o->ctx, bt->tok + start + 1, sizeof(int32_t) * (size_t)o->ctx);
        }
        *T = o->ctx;
        *real = o->batch * o->ctx;
    }
    int64_t shape[2] = { o->batch, *T };
    *x = ctpu_from_host(bt->hx, CTPU_I32, 2, shape);
    *y = ctpu_from_host(bt->hy, CTPU_I32, 2, shape);
    if (ctpu_is_null(*x) || ctpu_is_null(*y)) return CTPU_ERR_INVALID_ARG;
    return CTPU_OK;   /* with --dynamic, x and y come marked (main's ctpu_declare_dynamic_inputs) */
}

typedef struct {
    ctpu_tensor ln1_w, ln1_b, wq, bq, wk, bk, wv, bv, wo, bo, ln2_w, ln2_b, w1, b1, w2, b2;
} block;

typedef struct {
    int64_t L, H, D, hd, T, V;
    ctpu_dtype dt;   /* of the forward's parameters and activations */
    double dropout;
    ctpu_tensor wte, wpe, lnf_w, lnf_b;
    block blk[MAX_LAYERS];
    ctpu_tensor decay[4 * MAX_LAYERS + 2], no_decay[8 * MAX_LAYERS + 2];
    int n_decay, n_no_decay;
    /* every parameter in creation order, and its checkpoint name */
    ctpu_tensor params[12 * MAX_LAYERS + 4];
    char names[12 * MAX_LAYERS + 4][32];
    const char *name_ptrs[12 * MAX_LAYERS + 4];
    int n_params;
} gpt;

static void param_name(gpt *g, int l, const char *name, ctpu_tensor t)
{
    int i = g->n_params++;
    g->params[i] = t;
    g->name_ptrs[i] = g->names[i];
    if (l < 0) snprintf(g->names[i], sizeof g->names[i], "%s", name);
    else snprintf(g->names[i], sizeof g->names[i], "h.%d.%s", l, name);
}

static ctpu_tensor param_normal(gpt *g, int l, const char *name, int64_t r, int64_t c, double std)
{
    int64_t shape[2] = { r, c };
    ctpu_tensor t = ctpu_rand_normal(CTPU_F32, 2, shape, 0.0, std);
    ctpu_set_requires_grad(t, true);
    g->decay[g->n_decay++] = t;
    param_name(g, l, name, t);
    return t;
}

static ctpu_tensor param_const(gpt *g, int l, const char *name, int64_t n, double v)
{
    ctpu_tensor t = ctpu_full(CTPU_F32, 1, &n, v);
    ctpu_set_requires_grad(t, true);
    g->no_decay[g->n_no_decay++] = t;
    param_name(g, l, name, t);
    return t;
}

static ctpu_status gpt_init(gpt *g, const opts_t *o, int64_t vocab)
{
    memset(g, 0, sizeof *g);
    g->L = o->layers, g->H = o->heads, g->D = o->dmodel, g->hd = o->head_dim, g->T = o->ctx, g->V = vocab;
    g->dropout = o->dropout;
    g->dt = o->dtype;
    int64_t D = g->D, HD = g->H * g->hd;
    double proj_std = 0.02 / sqrt(2.0 * (double)g->L);
    g->wte = param_normal(g, -1, "wte", vocab, D, 0.02);
    g->wpe = param_normal(g, -1, "wpe", g->T, D, 0.02);
    for (int l = 0; l < (int)g->L; l++) {
        block *b = &g->blk[l];
        b->ln1_w = param_const(g, l, "ln1.weight", D, 1), b->ln1_b = param_const(g, l, "ln1.bias", D, 0);
        b->wq = param_normal(g, l, "attn.wq", D, HD, 0.02), b->bq = param_const(g, l, "attn.bq", HD, 0);
        b->wk = param_normal(g, l, "attn.wk", D, HD, 0.02), b->bk = param_const(g, l, "attn.bk", HD, 0);
        b->wv = param_normal(g, l, "attn.wv", D, HD, 0.02), b->bv = param_const(g, l, "attn.bv", HD, 0);
        b->wo = param_normal(g, l, "attn.wo", HD, D, proj_std), b->bo = param_const(g, l, "attn.bo", D, 0);
        b->ln2_w = param_const(g, l, "ln2.weight", D, 1), b->ln2_b = param_const(g, l, "ln2.bias", D, 0);
        b->w1 = param_normal(g, l, "mlp.w1", D, 4 * D, 0.02), b->b1 = param_const(g, l, "mlp.b1", 4 * D, 0);
        b->w2 = param_normal(g, l, "mlp.w2", 4 * D, D, proj_std), b->b2 = param_const(g, l, "mlp.b2", D, 0);
    }
    g->lnf_w = param_const(g, -1, "lnf.weight", D, 1), g->lnf_b = param_const(g, -1, "lnf.bias", D, 0);
    for (int i = 0; i < g->n_decay; i++)
        if (ctpu_is_null(g->decay[i])) return CTPU_ERR_INVALID_ARG;
    for (int i = 0; i < g->n_no_decay; i++)
        if (ctpu_is_null(g->no_decay[i])) return CTPU_ERR_INVALID_ARG;
    return CTPU_OK;
}

/* [B, T, H*hd] -> [B, T, H, hd] (a view: the attention kernel reads the
 * heads in this layout, no permute copies) */
static ctpu_tensor split_heads(const gpt *g, ctpu_tensor t, int64_t B, int64_t T)
{
    int64_t s[4] = { B, T, g->H, g->hd };
    return ctpu_reshape(t, 4, s);
}

/* A parameter as the forward uses it: with --dtype bf16 a bf16 copy of the
 * f32 master (ctpu_cast; its gradient flows back to the master as f32, so
 * the optimizer updates f32 weights), else the parameter itself. */
static ctpu_tensor P(const gpt *g, ctpu_tensor t) { return g->dt == CTPU_BF16 ? ctpu_cast(t, CTPU_BF16) : t; }

static ctpu_tensor linear(const gpt *g, ctpu_tensor x, ctpu_tensor w, ctpu_tensor b)
{
    return ctpu_add(ctpu_matmul(x, P(g, w)), P(g, b));
}

static ctpu_tensor norm(const gpt *g, ctpu_tensor x, ctpu_tensor w, ctpu_tensor b)
{
    return ctpu_layer_norm(x, P(g, w), P(g, b), 1e-5);
}

/* Causal self-attention: q, k, v [B, T, H, hd] -> [B, T, H, hd], one
 * blockwise kernel (ctpu_scaled_dot_product_attention_bthd: scale
 * 1/sqrt(hd), causal, dropout on the probabilities; the bits of
 * ctpu_scaled_dot_product_attention on the [B, H, T, hd] permutes, without
 * their copies); no [T, T] score tensor exists. */
static ctpu_tensor attention(const gpt *g, ctpu_tensor q, ctpu_tensor k, ctpu_tensor v, bool training)
{
    return ctpu_scaled_dot_product_attention_bthd(q, k, v, CTPU_NULL, CTPU_MASK_NONE, true, 0.0,
                                                  training ? g->dropout : 0.0);
}

/* Next-token logits [B, T, V] of x [B, T] (T <= ctx). */
static ctpu_tensor gpt_logits(const gpt *g, ctpu_tensor x, int64_t B, int64_t T, bool training)
{
    double p = g->dropout;
    ctpu_tensor wte = P(g, g->wte);   /* cast once: the embedding and the tied head */
    ctpu_tensor wpe = P(g, ctpu_slice(g->wpe, 0, 0, T, 1));   /* at T = ctx too: one structure for every T */
    ctpu_tensor h = ctpu_add(ctpu_embedding(wte, x), wpe);   /* [B, T, D] + [T, D] */
    h = ctpu_dropout(h, p, training);
    for (int64_t l = 0; l < g->L; l++) {
        const block *b = &g->blk[l];
        ctpu_tensor a = norm(g, h, b->ln1_w, b->ln1_b);
        ctpu_tensor q = split_heads(g, linear(g, a, b->wq, b->bq), B, T);
        ctpu_tensor k = split_heads(g, linear(g, a, b->wk, b->bk), B, T);
        ctpu_tensor v = split_heads(g, linear(g, a, b->wv, b->bv), B, T);
        ctpu_tensor o = attention(g, q, k, v, training);   /* [B, T, H, hd] */
        int64_t s3[3] = { B, T, g->H * g->hd };
        o = linear(g, ctpu_reshape(o, 3, s3), b->wo, b->bo);
        h = ctpu_add(h, ctpu_dropout(o, p, training));
        ctpu_tensor m = norm(g, h, b->ln2_w, b->ln2_b);
        m = linear(g, ctpu_gelu(linear(g, m, b->w1, b->b1), false), b->w2, b->b2);
        h = ctpu_add(h, ctpu_dropout(m, p, training));
    }
    h = norm(g, h, g->lnf_w, g->lnf_b);
    return ctpu_matmul_t(h, wte, false, true);   /* [B, T, V], tied head */
}

/* Mean cross entropy of the next-token logits for x, y [B, T] over the
 * targets other than DOCBATCH_IGNORE (--by-document's padding). */
static ctpu_tensor gpt_loss(const gpt *g, ctpu_tensor x, ctpu_tensor y, int64_t B, int64_t T, bool training)
{
    ctpu_tensor logits = gpt_logits(g, x, B, T, training);
    int64_t s2[2] = { B * T, g->V }, s1 = B * T;
    ctpu_ce_opts ce = ctpu_ce_defaults();
    ce.ignore_index = DOCBATCH_IGNORE;
    return ctpu_cross_entropy(ctpu_reshape(logits, 2, s2), ctpu_reshape(y, 1, &s1), &ce);
}

/* Mean val loss over the fixed evaluation batches (no grad, no dropout). */
static ctpu_status evaluate(const gpt *g, batcher *bv, const opts_t *o, double *out)
{
    ctpu_no_grad_begin();
    ctpu_tensor *ls = malloc(sizeof(ctpu_tensor) * (size_t)o->eval_batches);
    ctpu_status st = ls ? CTPU_OK : CTPU_ERR_OOM;
    int64_t done = 0;
    for (int64_t e = 0; st == CTPU_OK && e < o->eval_batches; e++) {
        ctpu_step_begin();
        ctpu_tensor x, y;
        int64_t T, real;
        st = make_batch(bv, o, o->by_doc ? (uint64_t)e : (1ull << 40) + (uint64_t)e, &x, &y, &T, &real);
        if (st == CTPU_OK) {
            ls[e] = ctpu_keep(gpt_loss(g, x, y, o->batch, T, false));
            if (ctpu_is_null(ls[e])) st = CTPU_ERR_INVALID_ARG;
            else done++;
        }
        ctpu_step_end();
    }
    double sum = 0;
    for (int64_t e = 0; e < done; e++) {
        double l = 0;
        if (st == CTPU_OK) st = ctpu_item(ls[e], &l);
        sum += l;
        ctpu_release(ls[e]);
    }
    free(ls);
    ctpu_no_grad_end();
    *out = sum / (double)o->eval_batches;
    return st;
}

/* The training step as a ctpu_step_fn (--compile): in = {x, y}, scalars =
 * {lr}, out = {loss}. */
typedef struct { const gpt *g; ctpu_optim *opt; int64_t B, T; } step_ctx;

static ctpu_status train_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    step_ctx *s = ctx;
    ctpu_optim_zero_grad(s->opt);
    ctpu_tensor loss = gpt_loss(s->g, in[0], in[1], s->B, s->T, true);
    ctpu_status st = ctpu_is_null(loss) ? ctpu_last_status() : ctpu_backward(loss);
    if (st == CTPU_OK) st = ctpu_optim_set_lr(s->opt, sc[0]);
    if (st == CTPU_OK) st = ctpu_optim_step(s->opt);
    out[0] = loss;
    return st;
}

/* What the loop carries from one evaluation to the next, saved with the
 * checkpoint: the current interval's train losses so far (their sum, added
 * in step order, and count) and the last evaluation's train and val loss. */
typedef struct {
    double isum, train_loss, val_loss;
    int64_t in;
    int64_t meaned;   /* --ddp: the interval's losses[0, meaned) are the ranks' means already (not saved) */
} loop_state;

static ctpu_status save_run(const gpt *g, const ctpu_optim *opt, const opts_t *o, const loop_state *ls,
                            const ctpu_tensor *losses, int64_t nb)
{
    double sum = ls->isum;   /* the unread losses of this interval: read (waits for the device) */
    for (int64_t i = 0; i < nb; i++) {
        double l;
        ctpu_status st = ctpu_item(losses[i], &l);
        if (st != CTPU_OK) return st;
        sum += l;
    }
    char v[5][32];
    snprintf(v[0], sizeof v[0], "%llu", (unsigned long long)o->seed);
    snprintf(v[1], sizeof v[1], "%.17g", sum);
    snprintf(v[2], sizeof v[2], "%lld", (long long)(ls->in + nb));
    snprintf(v[3], sizeof v[3], "%.17g", ls->train_loss);
    snprintf(v[4], sizeof v[4], "%.17g", ls->val_loss);
    const char *meta[12] = { "demo", "char_gpt", "char_gpt.seed", v[0], "char_gpt.interval_sum", v[1],
                             "char_gpt.interval_n", v[2], "char_gpt.train_loss", v[3], "char_gpt.val_loss", v[4] };
    return ctpu_checkpoint_save(o->save_path, g->n_params, g->name_ptrs, g->params, opt, NULL, 6, meta);
}

/* One "char_gpt.*" number of an open checkpoint; false (with a message) if
 * absent or malformed. */
static bool meta_num(const ctpu_safetensors *f, const char *path, const char *key, double *d, uint64_t *u)
{
    const char *v = ctpu_safetensors_metadata(f, key);
    char *end = NULL;
    errno = 0;
    if (v && d) *d = strtod(v, &end);
    if (v && u) *u = strtoull(v, &end, 10);
    if (!v || errno || end == v || *end) {
        fprintf(stderr, "char_gpt: %s: %s metadata \"%s\" (not a char_gpt checkpoint?)\n", path,
                v ? "malformed" : "no", key);
        return false;
    }
    return true;
}

/* Restore a run saved by save_run into g, opt and *ls. */
static int resume_run(gpt *g, ctpu_optim *opt, const opts_t *o, loop_state *ls)
{
    ctpu_safetensors *f = ctpu_safetensors_open(o->resume_path);
    if (!f) return fail("resuming");
    uint64_t seed = 0, n = 0;
    bool ok = meta_num(f, o->resume_path, "char_gpt.seed", NULL, &seed) &&
              meta_num(f, o->resume_path, "char_gpt.interval_sum", &ls->isum, NULL) &&
              meta_num(f, o->resume_path, "char_gpt.interval_n", NULL, &n) &&
              meta_num(f, o->resume_path, "char_gpt.train_loss", &ls->train_loss, NULL) &&
              meta_num(f, o->resume_path, "char_gpt.val_loss", &ls->val_loss, NULL);
    ctpu_safetensors_close(f);
    if (!ok) return 1;
    ls->in = (int64_t)n;
    if (seed != o->seed) {
        fprintf(stderr, "char_gpt: %s was saved with --seed %llu, not %llu\n", o->resume_path,
                (unsigned long long)seed, (unsigned long long)o->seed);
        return 1;
    }
    if (ctpu_checkpoint_load(o->resume_path, g->n_params, g->name_ptrs, g->params, opt, NULL) != CTPU_OK)
        return fail("resuming");
    int64_t step = ctpu_optim_steps(opt);
    if (step > o->steps || ls->in < 0 || ls->in > step || ls->in >= o->eval_every) {
        fprintf(stderr, "char_gpt: %s: step %lld, %lld steps into an interval: not a run of --steps %lld "
                "--eval-every %lld\n", o->resume_path, (long long)step, (long long)ls->in, (long long)o->steps,
                (long long)o->eval_every);
        return 1;
    }
    return 0;
}

/* One byte of the sample as printed: newline, tab and printable bytes as
 * they are (bytes >= 0x80 too: pieces of UTF-8), other control bytes as C
 * escapes so that no BEL rings and no backspace overstrikes the terminal. */
static void put_sample_byte(uint8_t b)
{
    if (b == 0x07) fputs("\\a", stdout);
    else if (b == 0x08) fputs("\\b", stdout);
    else if ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7f) printf("\\x%02x", b);
    else putchar(b);
}

/* The sample after the result line: --sample bytes after --prompt, drawn at
 * --temperature from the model (eval mode, no dropout, no grad) through a
 * fixed [1, ctx] window: the last ctx tokens so far, left-aligned and padded
 * with DOCBATCH_PAD_ID (causal attention: the padding after position n - 1
 * changes nothing before it), so every step runs one program shape; the
 * logits of position n - 1 are read on the host. Draw i takes
 * u = (splitmix64(key + 0x9E3779B97F4A7C15 (1 + i)) >> 11) 2^-53 with
 * key = splitmix64(seed + 3) and picks the first byte whose cumulative
 * softmax(logits / temperature) (double) passes u; temperature 0 picks the
 * largest logit. The unseen-byte id is never drawn. */
static int generate(const gpt *g, const corpus *c, const opts_t *o)
{
    int64_t T = g->T, V = g->V, cap = (int64_t)strlen(o->prompt) + o->sample_len;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)cap), *win = malloc(sizeof(int32_t) * (size_t)T);
    float *lg = malloc(sizeof(float) * (size_t)(T * V));
    double *pr = malloc(sizeof(double) * (size_t)V);
    if (!seq || !win || !lg || !pr) { fprintf(stderr, "char_gpt: out of memory\n"); return 1; }
    int64_t n = 0;
    for (const char *q = o->prompt; *q; q++) seq[n++] = c->id_of[(uint8_t)*q];
    printf("sample (temperature %g, seed %llu, %lld bytes after the prompt):\n", o->temperature,
           (unsigned long long)o->seed, (long long)o->sample_len);
    for (int64_t i = 0; i < n; i++) put_sample_byte(seq[i] == V - 1 ? '?' : c->byte_of[seq[i]]);
    uint64_t key = splitmix64(o->seed + 3);
    int rc = 0;
    ctpu_no_grad_begin();
    for (int64_t i = 0; i < o->sample_len && !rc; i++) {
        int64_t w = n < T ? n : T, shape[2] = { 1, T };
        for (int64_t j = 0; j < T; j++) win[j] = j < w ? seq[n - w + j] : DOCBATCH_PAD_ID;
        ctpu_step_begin();
        ctpu_tensor x = ctpu_from_host(win, CTPU_I32, 2, shape);
        ctpu_tensor logits = gpt_logits(g, x, 1, T, false);
        if (ctpu_to_host_as_f32(logits, lg, sizeof(float) * (size_t)(T * V)) != CTPU_OK) rc = fail("sampling");
        ctpu_step_end();
        if (rc) break;
        const float *l = lg + (w - 1) * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V - 1; v++)
            if (l[v] > l[best]) best = v;
        int64_t pick = best;
        if (o->temperature > 0) {
            double sum = 0, acc = 0;
            for (int64_t v = 0; v < V - 1; v++) sum += pr[v] = exp(((double)l[v] - (double)l[best]) / o->temperature);
            double u = (double)(splitmix64(key + 0x9E3779B97F4A7C15ull * (1 + (uint64_t)i)) >> 11) * 0x1p-53 * sum;
            for (pick = 0; pick < V - 2; pick++)
                if ((acc += pr[pick]) > u) break;
        }
        seq[n++] = (int32_t)pick;
        put_sample_byte(c->byte_of[pick]);
    }
    ctpu_no_grad_end();
    printf("\n");
    fflush(stdout);
    free(seq);
    free(win);
    free(lg);
    free(pr);
    return rc;
}

/* The attention products' MXU utilisation on each TPU generation (stderr,
 * before the cache report): per layer, the forward's two batched products
 * q@k^T [T, hd] x [hd, T] and p@v [T, T] x [T, hd] over batch x heads, at
 * T = ctx, estimated by ctpu_cost_matmul (include/ctpu.h: each of M, K, N
 * padded up to the MXU side, utilisation = useful / padded MACs). A head_dim
 * below the MXU side pads K of q@k^T and N of p@v: --head-dim 64 against 128
 * shows the waste on v5e (128x128) and v6e (256x256). tests/char_gpt_mxu.sh
 * pins these figures to the formula. */
static int attention_cost_report(const gpt *g, int64_t batch)
{
    static const char *const chips[] = { "v5e", "v5p", "v6e", "7x" };
    int64_t T = g->T, hd = g->hd, bh = batch * g->H;
    fprintf(stderr, "attention products on the MXU (per layer, forward; %lld x %lld heads, T %lld, head_dim %lld, %s; "
            "estimate):\n", (long long)batch, (long long)g->H, (long long)T, (long long)hd, ctpu_dtype_name(g->dt));
    for (size_t i = 0; i < sizeof chips / sizeof *chips; i++) {
        ctpu_cost_estimate qk, pv;
        const ctpu_chip_info *ci = ctpu_chip_lookup(chips[i]);
        if (!ci || ctpu_cost_matmul(chips[i], bh, T, hd, T, g->dt, CTPU_PRECISION_DEFAULT, &qk) != CTPU_OK ||
            ctpu_cost_matmul(chips[i], bh, T, T, hd, g->dt, CTPU_PRECISION_DEFAULT, &pv) != CTPU_OK)
            return fail("attention cost");
        fprintf(stderr, "  %s, %dx%d MXU: q@k^T [%lld,%lld]x[%lld,%lld] %.1f%% of MACs useful (%.3g us); "
                "p@v [%lld,%lld]x[%lld,%lld] %.1f%% of MACs useful (%.3g us)\n", chips[i], ci->mxu_size,
                ci->mxu_size, (long long)T, (long long)hd, (long long)hd, (long long)T, 100 * qk.mxu_utilization,
                1e6 * qk.mxu_s, (long long)T, (long long)T, (long long)T, (long long)hd, 100 * pv.mxu_utilization,
                1e6 * pv.mxu_s);
    }
    return 0;
}

/* The progress bar (stderr, on a terminal or with --progress): the run's
 * steps dispatched so far and the learning rate; it reads no value from the
 * device (the losses are read once per interval). */
static void progress_bar(int64_t done, int64_t total, double lr)
{
    char bar[31];
    int w = (int)(30 * done / total);
    for (int i = 0; i < 30; i++) bar[i] = i < w ? '=' : i == w ? '>' : ' ';
    bar[30] = 0;
    fprintf(stderr, "\r[%s] step %lld/%lld lr %.2e ", bar, (long long)done, (long long)total, lr);
    fflush(stderr);
}

/* ------------------------------------------------------------ data parallel
 * --ddp (issue 19): each process started by mpirun is a rank of
 * ctpu_dist_init (one emulated chip); --batch stays the global batch, of
 * which rank r trains rows [r b / N, (r+1) b / N) (ctpu_ddp_shard) and
 * ctpu_ddp averages the gradients after backward. --grad-accum N is the
 * same computation in one process: the N micro-batches of those rows in
 * order, their gradients summed by backward and divided once by N. The two
 * give the same bits (tests/dist: logs and checkpoints compared byte for
 * byte), because the all_reduce mean is a left fold in rank order divided
 * once by N and each micro-batch draws the dropout counters it would draw
 * in one process. Rank 0 speaks for the job (stdout, --log, --save, the
 * sample, the reports); the evaluation batches are split over the ranks. */

static int data_parallel_args(const opts_t *o)
{
    const char *why = NULL;
    if (o->ddp && o->grad_accum > 1) why = "--ddp with --grad-accum (the ranks are the micro-batches)";
    else if ((o->ddp || o->grad_accum > 1) && o->compile)
        why = "--compile with --ddp or --grad-accum (the gradients' all_reduce and the micro-batch loop are graph "
              "breaks)";
    else if (o->grad_accum > o->batch) why = "--grad-accum more than --batch (every micro-batch needs a row)";
    if (why) fprintf(stderr, "char_gpt: %s\n", why);
    return why != NULL;
}

/* ctpu_dist_init (--ddp) or ctpu_init; ranks other than 0 go quiet. */
static int data_parallel_init(opts_t *o, bool *tty)
{
    if (!o->ddp) return ctpu_init() == CTPU_OK ? 0 : fail("init");
    if (ctpu_dist_init() != CTPU_OK) return fail("init");
    if (ctpu_dist_world_size() > o->batch) {
        fprintf(stderr, "char_gpt: --batch %lld is less than the %d ranks (every rank needs a row)\n",
                (long long)o->batch, ctpu_dist_world_size());
        return 1;
    }
    if (ctpu_dist_rank() != 0) {
        if (!freopen("/dev/null", "w", stdout)) return fail("silencing stdout");
        *tty = false;
        o->log_path = NULL;
        o->sample_len = 0;
    }
    return 0;
}

/* The dropout counters one row of a training batch of length T draws
 * (ctpu_dropout draws its input's numel when p > 0): the embeddings'
 * [T, D], and per block the attention probabilities' [H, T, T] (SDPA draws
 * what ctpu_dropout over them would) and the two residual branches'
 * [T, D]. data_parallel_step checks it against the
 * generator after each micro-batch's forward: a change to the model's
 * dropouts that forgets this is an error, never a silent mismatch. */
static uint64_t dropout_draws_per_row(const gpt *g, int64_t T)
{
    if (!(g->dropout > 0)) return 0;
    return (uint64_t)(T * g->D * (1 + 2 * g->L) + g->L * g->H * T * T);
}

/* One training step's forwards and backwards over micro-batches: --ddp
 * this rank's rows, then ctpu_ddp_sync_grads (bucketed gradient mean);
 * --grad-accum N the N micro-batches in order, then every gradient divided
 * by N. Micro-batch k is rows [lo, hi) = [k b / N, (k+1) b / N) and draws
 * from base + lo * (draws per row), where one process going through the
 * micro-batches in order would; afterwards the generator is at
 * base + b * (draws per row) on every rank, as after one whole batch. The
 * loss: --grad-accum ((l_0 + l_1) + ...) / N; --ddp this rank's l_r
 * (ddp_mean_losses turns it into the ranks' mean, the same bits). */
static ctpu_tensor data_parallel_step(const gpt *g, ctpu_ddp *ddp, const opts_t *o, ctpu_tensor x, ctpu_tensor y,
                                      int64_t T)
{
    int n = ddp ? ctpu_dist_world_size() : (int)o->grad_accum;
    int k0 = ddp ? ctpu_dist_rank() : 0, k1 = ddp ? k0 + 1 : n;
    uint64_t seed, base, off, per_row = dropout_draws_per_row(g, T);
    if (ctpu_rng_get_state(&seed, &base) != CTPU_OK) return ctpu_error_handle();
    ctpu_tensor sum = CTPU_NULL;
    for (int k = k0; k < k1; k++) {
        int64_t lo, hi;
        ctpu_ddp_shard(o->batch, k, n, &lo, &hi);
        uint64_t from = base + (uint64_t)lo * per_row;
        ctpu_rng_set_state(seed, from);
        ctpu_tensor l = gpt_loss(g, ctpu_slice(x, 0, lo, hi, 1), ctpu_slice(y, 0, lo, hi, 1), hi - lo, T, true);
        if (ctpu_is_null(l)) return l;
        ctpu_rng_get_state(&seed, &off);
        if (off - from != (uint64_t)(hi - lo) * per_row) {
            ctpu_report_error(CTPU_ERR_STATE, "micro-batch %d drew %llu dropout counters for %lld rows, not the %llu "
                              "dropout_draws_per_row gives (the micro-batches' counter ranges would overlap)", k,
                              (unsigned long long)(off - from), (long long)(hi - lo),
                              (unsigned long long)((uint64_t)(hi - lo) * per_row));
            return ctpu_error_handle();
        }
        if (ctpu_backward(l) != CTPU_OK) return ctpu_error_handle();
        l = ctpu_detach(l);
        sum = k == k0 ? l : ctpu_add(sum, l);
    }
    ctpu_rng_set_state(seed, base + (uint64_t)o->batch * per_row);
    if (ddp) return ctpu_ddp_sync_grads(ddp) == CTPU_OK ? sum : ctpu_error_handle();
    ctpu_status st = CTPU_OK;
    ctpu_no_grad_begin();
    for (int i = 0; i < g->n_params && st == CTPU_OK; i++) {
        ctpu_tensor gr = ctpu_grad(g->params[i]);
        if (!ctpu_is_null(gr)) st = ctpu_assign(gr, ctpu_div_scalar(gr, (double)n));
    }
    ctpu_no_grad_end();
    return st == CTPU_OK ? ctpu_div_scalar(sum, (double)n) : ctpu_error_handle();
}

/* --ddp: losses[*done, n) (this rank's, kept) become the ranks' means, by
 * one all_reduce for all of them: the rank-order fold divided once by N,
 * --grad-accum's bits. *done = n after. A world of one rank: nothing. */
static ctpu_status ddp_mean_losses(ctpu_tensor *losses, int64_t n, int64_t *done)
{
    int64_t k = n - *done, one = 1;
    if (ctpu_dist_world_size() == 1 || k <= 0) {
        *done = n;
        return CTPU_OK;
    }
    ctpu_tensor *flat = malloc(sizeof(ctpu_tensor) * (size_t)k);
    if (!flat) return ctpu_report_error(CTPU_ERR_OOM, "char_gpt: out of memory");
    ctpu_scope_begin();
    for (int64_t i = 0; i < k; i++) flat[i] = ctpu_reshape(losses[*done + i], 1, &one);
    ctpu_tensor m = ctpu_all_reduce(k == 1 ? flat[0] : ctpu_concat((int)k, flat, 0), CTPU_DIST_MEAN);
    ctpu_status st = ctpu_is_null(m) ? ctpu_last_status() : CTPU_OK;
    for (int64_t i = 0; i < k && st == CTPU_OK; i++) {
        ctpu_tensor t = ctpu_keep(ctpu_reshape(ctpu_slice(m, 0, i, i + 1, 1), 0, NULL));
        if (ctpu_is_null(t)) {
            st = ctpu_last_status();
            break;
        }
        ctpu_release(losses[*done + i]);
        losses[*done + i] = t;
    }
    ctpu_scope_end();
    free(flat);
    if (st == CTPU_OK) *done = n;
    return st;
}

/* evaluate() over the ranks: rank r runs evaluation batches
 * [r E / N, (r+1) E / N); the ranks add their losses into one vector of E
 * (zeros elsewhere: adding 0 is exact) and sum it in batch order as
 * evaluate() does, so the val loss has the one-process run's bits. */
static ctpu_status evaluate_ranks(const gpt *g, batcher *bv, const opts_t *o, double *out)
{
    int world = ctpu_dist_world_size();
    if (world == 1) return evaluate(g, bv, o, out);
    int64_t E = o->eval_batches, lo, hi;
    ctpu_ddp_shard(E, ctpu_dist_rank(), world, &lo, &hi);
    float *v = calloc((size_t)E, sizeof(float));
    ctpu_tensor *ls = malloc(sizeof(ctpu_tensor) * (size_t)E);
    ctpu_status st = v && ls ? CTPU_OK : ctpu_report_error(CTPU_ERR_OOM, "char_gpt: out of memory");
    int64_t made = lo;
    ctpu_no_grad_begin();
    for (int64_t e = lo; st == CTPU_OK && e < hi; e++) {
        ctpu_step_begin();
        ctpu_tensor x, y;
        int64_t T, real;
        st = make_batch(bv, o, o->by_doc ? (uint64_t)e : (1ull << 40) + (uint64_t)e, &x, &y, &T, &real);
        if (st == CTPU_OK) {
            ls[e] = ctpu_keep(gpt_loss(g, x, y, o->batch, T, false));
            st = ctpu_is_null(ls[e]) ? ctpu_last_status() : CTPU_OK;
            made += st == CTPU_OK;
        }
        ctpu_step_end();
    }
    for (int64_t e = lo; e < made; e++) {
        double l = 0;
        if (st == CTPU_OK) st = ctpu_item(ls[e], &l);
        v[e] = (float)l;   /* exact: the loss is f32 or bf16 */
        ctpu_release(ls[e]);
    }
    ctpu_no_grad_end();
    ctpu_scope_begin();
    ctpu_tensor all = ctpu_all_reduce(ctpu_from_host(v, CTPU_F32, 1, &E), CTPU_DIST_SUM);   /* every rank calls it */
    ctpu_status st2 = ctpu_to_host(all, v, sizeof(float) * (size_t)E);
    ctpu_scope_end();
    if (st == CTPU_OK) st = st2;
    double sum = 0;
    for (int64_t e = 0; e < E; e++) sum += (double)v[e];
    *out = sum / (double)E;
    free(v);
    free(ls);
    return st;
}

/* The checkpoint of save_run, written by rank 0 after every rank has
 * averaged the interval's pending losses (whose sum it stores). */
static ctpu_status save_ranks(const gpt *g, const ctpu_optim *opt, const opts_t *o, loop_state *ls, ctpu_tensor *losses,
                              int64_t nb)
{
    ctpu_status st = ddp_mean_losses(losses, nb, &ls->meaned);
    if (st == CTPU_OK && ctpu_dist_rank() == 0) st = save_run(g, opt, o, ls, losses, nb);
    return st;
}

/* What the training loop carries: the model and its optimizer, the step
 * (compiled or not), the interval's pending losses and learning rates, the
 * counters of the result line. */
typedef struct {
    opts_t o;
    corpus c;
    batcher btr, bva;
    gpt *g;
    ctpu_optim *opt;
    step_ctx sctx;
    ctpu_compiled *cstep;
    ctpu_ddp *ddp;
    FILE *log;
    const char *mode;
    bool tty;
    loop_state lst;
    ctpu_tensor *losses;
    double *lrs;
    double train_time, t0;
    int64_t tokens, nb, step, compiles0, recompiles0;
} run_t;

/* Reads the corpus and makes the two batchers; 1 (with the message) when
 * the data cannot serve --ctx. */
static int load_data(run_t *r)
{
    const opts_t *o = &r->o;
    char err[512];
    if (corpus_load(o->data, &r->c, err, sizeof err) != 0) { fprintf(stderr, "char_gpt: %s\n", err); return 1; }
    if (!o->by_doc && (r->c.n_train <= o->ctx || r->c.n_val <= o->ctx)) {
        fprintf(stderr, "char_gpt: %s: %lld train / %lld val tokens, --ctx %lld needs more than that\n", o->data,
                (long long)r->c.n_train, (long long)r->c.n_val, (long long)o->ctx);
        corpus_free(&r->c);
        return 1;
    }
    memset(&r->bva, 0, sizeof r->bva);
    if (batcher_init(&r->btr, r->c.train, r->c.n_train, r->c.doc_train, r->c.fortunes_train, o, 1, err, sizeof err) ||
        batcher_init(&r->bva, r->c.val, r->c.n_val, r->c.doc_val, r->c.fortunes_val, o, 2, err, sizeof err)) {
        fprintf(stderr, "char_gpt: %s: %s\n", o->data, err);
        batcher_free(&r->btr);
        batcher_free(&r->bva);
        corpus_free(&r->c);
        return 1;
    }
    return 0;
}

/* The model, the optimizer, the compiled step (--compile), a resumed run
 * (--resume), the dynamic batches (--dynamic), the DDP wrapper (--ddp). */
static int make_model(run_t *r)
{
    const opts_t *o = &r->o;
    ctpu_manual_seed(o->seed);
    gpt *g = r->g = malloc(sizeof *g);
    if (!g) { fprintf(stderr, "char_gpt: out of memory\n"); return 1; }
    if (gpt_init(g, o, r->c.vocab) != CTPU_OK) return fail("making the model");
    ctpu_param_group groups[2] = { { g->decay, g->n_decay, 1.0, o->wd }, { g->no_decay, g->n_no_decay, 1.0, 0.0 } };
    ctpu_adamw_opts ao = { o->lr, 0.9, 0.95, 1e-8, o->wd };
    if (!(r->opt = ctpu_adamw_create_groups(2, groups, &ao))) return fail("making the optimizer");
    if (o->capturable && ctpu_optim_set_capturable(r->opt, true) != CTPU_OK) return fail("making the optimizer");
    r->sctx = (step_ctx){ g, r->opt, o->batch, o->ctx };
    r->cstep = o->compile ? ctpu_compile(train_step, &r->sctx, &(ctpu_compile_opts){ .name = "char_gpt.train_step" })
                          : NULL;
    if (o->compile && !r->cstep) return fail("compiling the step");
    r->lst = (loop_state){ .train_loss = NAN, .val_loss = NAN };   /* nan until the first evaluation */
    if (o->resume_path) {
        if (resume_run(g, r->opt, o, &r->lst)) return 1;
        printf("char_gpt: resumed %s at step %lld (%lld steps into the interval)\n", o->resume_path,
               (long long)ctpu_optim_steps(r->opt), (long long)r->lst.in);
    }
    /* --dynamic: each batch is a new tensor; every i32 [B, T] made from host data from here on (the
     * training and evaluation batches, the sampling prompts) comes with T marked dynamic in [2, ctx].
     * Declared after the parameters are made or loaded. */
    if (o->dynamic && o->ctx >= 2 && ctpu_declare_dynamic_inputs(CTPU_I32, 2, 1, 2, o->ctx) != CTPU_OK)
        return fail("declaring the batches dynamic");
    /* after a resume: rank 0's parameters are broadcast */
    if (o->ddp && !(r->ddp = ctpu_ddp_create(g->n_params, g->params, NULL))) return fail("making the DDP wrapper");
    return 0;
}

/* The --log file's header; the mode the result line names (TORCH_COMPILE_DISABLE=1, the
 * runtime's switch: --compile's step runs fn in the current mode); the banner. */
static int open_log_and_banner(run_t *r)
{
    const opts_t *o = &r->o;
    if (o->log_path) {
        if (!(r->log = fopen(o->log_path, "w"))) {
            fprintf(stderr, "char_gpt: cannot write %s: %s\n", o->log_path, strerror(errno));
            return 1;
        }
        fprintf(r->log, "step,lr,train_loss,val_loss\n");
    }
    const char *cdis = getenv("TORCH_COMPILE_DISABLE");
    bool compile_off = o->compile && cdis && strcmp(cdis, "1") == 0;
    r->mode = o->compile && !compile_off ? "compiled" : ctpu_mode_name(ctpu_get_mode());
    if (compile_off)
        printf("char_gpt: --compile with TORCH_COMPILE_DISABLE=1: compilation disabled, the step runs in mode %s\n",
               r->mode);
    const gpt *g = r->g;
    const corpus *c = &r->c;
    int64_t nparams = 0;
    for (int i = 0; i < g->n_decay; i++) nparams += ctpu_numel(g->decay[i]);
    for (int i = 0; i < g->n_no_decay; i++) nparams += ctpu_numel(g->no_decay[i]);
    printf("char_gpt: %s: %lld files, %lld/%lld fortunes, %lld/%lld train/val tokens, vocab %d; GPT %lld layers, "
           "%lld heads x %lld, dmodel %lld, ctx %lld, %lld parameters, %s; batch %lld%s, %lld steps, lr %g, "
           "warmup %lld, dropout %g, seed %llu, mode %s\n",
           o->data, (long long)c->files, (long long)c->fortunes_train, (long long)c->fortunes_val, (long long)c->n_train,
           (long long)c->n_val, c->vocab, (long long)o->layers, (long long)o->heads, (long long)o->head_dim,
           (long long)o->dmodel, (long long)o->ctx, (long long)nparams, ctpu_dtype_name(o->dtype), (long long)o->batch,
           o->by_doc ? " (by document)" : "", (long long)o->steps, o->lr,
           (long long)o->warmup, o->dropout, (unsigned long long)o->seed, r->mode);
    if (o->ddp) printf("char_gpt: data parallel over %d ranks (global batch %lld)\n", ctpu_dist_world_size(), (long long)o->batch);
    if (o->grad_accum > 1) printf("char_gpt: %lld micro-batches per step, gradients accumulated\n", (long long)o->grad_accum);
    fflush(stdout);
    return 0;
}

/* One training step at learning rate lr: the compiled step, or forward,
 * backward (data parallel or accumulated when asked) and the update; its
 * loss joins the interval's. */
static int train_one(run_t *r, double lr)
{
    const opts_t *o = &r->o;
    ctpu_step_begin();
    ctpu_tensor x, y;
    int64_t T, real;
    if (make_batch(&r->btr, o, (uint64_t)r->step, &x, &y, &T, &real) != CTPU_OK) return fail("batch");
    ctpu_tensor in[2] = { x, y }, loss;
    r->sctx.T = T;   /* read by a capture only: a new T fails the guard and recaptures */
    if (r->cstep) {
        if (ctpu_compiled_call(r->cstep, 2, in, 1, &lr, 1, &loss) != CTPU_OK) return fail("compiled step");
    } else {
        ctpu_optim_zero_grad(r->opt);
        if (r->ddp || o->grad_accum > 1) {
            loss = data_parallel_step(r->g, r->ddp, o, x, y, T);
            if (ctpu_is_null(loss)) return fail("forward and backward");
        } else {
            loss = gpt_loss(r->g, x, y, o->batch, T, true);
            if (ctpu_is_null(loss)) return fail("forward");
            if (ctpu_backward(loss) != CTPU_OK) return fail("backward");
        }
        ctpu_optim_set_lr(r->opt, lr);
        if (ctpu_optim_step(r->opt) != CTPU_OK) return fail("optimizer step");
    }
    r->losses[r->nb] = ctpu_keep(ctpu_detach(loss));
    ctpu_step_end();
    r->lrs[r->nb++] = lr;
    r->tokens += real;
    return 0;
}

/* The interval ends: its losses read once (waits for the device), the
 * evaluation, the --log rows and the step line. */
static int end_interval(run_t *r)
{
    const opts_t *o = &r->o;
    loop_state *lst = &r->lst;
    int64_t nb = r->nb, step = r->step;
    if (ddp_mean_losses(r->losses, nb, &lst->meaned) != CTPU_OK) return fail("averaging the losses");
    double sum = lst->isum;
    double *ls = malloc(sizeof(double) * (size_t)nb);
    if (!ls) { fprintf(stderr, "char_gpt: out of memory\n"); return 1; }
    for (int64_t i = 0; i < nb; i++) {
        if (ctpu_item(r->losses[i], &ls[i]) != CTPU_OK) { free(ls); return fail("reading the losses"); }
        ctpu_release(r->losses[i]);
        sum += ls[i];
    }
    r->train_time += now_s() - r->t0;
    lst->train_loss = sum / (double)(lst->in + nb);
    if (evaluate_ranks(r->g, &r->bva, o, &lst->val_loss) != CTPU_OK) { free(ls); return fail("evaluation"); }
    if (r->log) {
        for (int64_t i = 0; i < nb; i++) {
            fprintf(r->log, "%lld,%.9g,%.9g,", (long long)(step + 1 - nb + i), r->lrs[i], ls[i]);
            if (i == nb - 1) fprintf(r->log, "%.9g", lst->val_loss);
            fprintf(r->log, "\n");
        }
    }
    free(ls);
    if (r->tty) fprintf(stderr, "\n");
    printf("step %lld/%lld train_loss=%.4f val_loss=%.4f val_bpc=%.4f tokens_per_s=%.0f\n",
           (long long)step + 1, (long long)o->steps, lst->train_loss, lst->val_loss, lst->val_loss / M_LN2,
           (double)r->tokens / r->train_time);
    fflush(stdout);
    r->nb = 0;
    lst->isum = 0;
    lst->in = 0;
    lst->meaned = 0;
    r->t0 = now_s();
    return 0;
}

/* Stopped inside an interval: log its steps so far (no val loss) and carry their sum. */
static int end_partial_interval(run_t *r)
{
    if (r->nb == 0) return 0;
    if (r->tty) fprintf(stderr, "\n");
    r->train_time += now_s() - r->t0;
    if (ddp_mean_losses(r->losses, r->nb, &r->lst.meaned) != CTPU_OK) return fail("averaging the losses");
    for (int64_t i = 0; i < r->nb; i++) {
        double l;
        if (ctpu_item(r->losses[i], &l) != CTPU_OK) return fail("reading the losses");
        ctpu_release(r->losses[i]);
        r->lst.isum += l;
        if (r->log) fprintf(r->log, "%lld,%.9g,%.9g,\n", (long long)(r->step - r->nb + i), r->lrs[i], l);
    }
    r->lst.in += r->nb;
    r->nb = 0;
    return 0;
}

/* The training loop from the optimizer's step count to --steps (or --stop-after). */
static int train(run_t *r)
{
    const opts_t *o = &r->o;
    r->losses = malloc(sizeof(ctpu_tensor) * (size_t)o->eval_every);
    r->lrs = malloc(sizeof(double) * (size_t)o->eval_every);
    if (!r->losses || !r->lrs) { fprintf(stderr, "char_gpt: out of memory\n"); return 1; }
    double min_lr = o->lr / 10;
    r->step = ctpu_optim_steps(r->opt);
    /* the result line's compiles / recompiles: the training and evaluation steps' programs (not those
     * that made and loaded the model: they run before this, and ctpu_sync compiles a pending trace) */
    if (ctpu_sync() != CTPU_OK) return fail("making the model");
    r->compiles0 = ctpu_metric_counter("programs_compiled");
    r->recompiles0 = ctpu_metric_counter("recompiles") + ctpu_metric_counter("strict_recompiles");
    r->t0 = now_s();
    for (; r->step < o->steps && !(o->stop_after && r->step >= o->stop_after); r->step++) {
        double lr = ctpu_lr_warmup_cosine(o->lr, r->step, o->warmup, o->steps, min_lr);
        if (train_one(r, lr)) return 1;
        if (r->tty) progress_bar(r->step + 1, o->steps, lr);
        if (((r->step + 1) % o->eval_every == 0 || r->step + 1 == o->steps) && end_interval(r)) return 1;
        if (o->save_every && (r->step + 1) % o->save_every == 0 &&
            save_ranks(r->g, r->opt, o, &r->lst, r->losses, r->nb) != CTPU_OK)
            return fail("saving a checkpoint");
    }
    return end_partial_interval(r);
}

/* After the loop: the last checkpoint (--save), the result line, the sample,
 * the attention cost and cache reports. */
static int finish(run_t *r)
{
    const opts_t *o = &r->o;
    if (o->stop_after && r->step < o->steps)
        printf("char_gpt: stopped after step %lld of %lld\n", (long long)r->step, (long long)o->steps);
    if (o->save_path) {
        if (save_ranks(r->g, r->opt, o, &r->lst, r->losses, 0) != CTPU_OK) return fail("saving the checkpoint");
        printf("char_gpt: saved %s at step %lld\n", o->save_path, (long long)r->step);
    }
    if (r->log) fclose(r->log);
    r->log = NULL;
    demo_print_compiled(r->cstep);
    char ws[32] = "";
    if (o->ddp) snprintf(ws, sizeof ws, " world_size=%d", ctpu_dist_world_size());
    printf("result val_loss=%.4f train_loss=%.4f steps=%lld tokens_per_s=%.0f compiles=%lld recompiles=%lld mode=%s%s\n",
           r->lst.val_loss, r->lst.train_loss, (long long)r->step,
           r->train_time > 0 ? (double)r->tokens / r->train_time : 0.0,
           (long long)(ctpu_metric_counter("programs_compiled") - r->compiles0),
           (long long)(ctpu_metric_counter("recompiles") + ctpu_metric_counter("strict_recompiles") - r->recompiles0),
           r->mode, ws);
    fflush(stdout);
    if (o->sample_len > 0 && generate(r->g, &r->c, o)) return 1;
    if (ctpu_dist_rank() == 0 && attention_cost_report(r->g, o->batch)) return 1;
    if (ctpu_dist_rank() == 0) ctpu_cache_report(stderr);   /* with --ddp: compute against communication */
    return 0;
}

static void free_run(run_t *r)
{
    ctpu_ddp_free(r->ddp);
    batcher_free(&r->btr);
    batcher_free(&r->bva);
    free(r->losses);
    free(r->lrs);
    ctpu_compiled_free(r->cstep);   /* the caller owns a compiled step (NULL without --compile) */
    ctpu_optim_free(r->opt);
    for (int i = 0; i < r->g->n_decay; i++) ctpu_release(r->g->decay[i]);
    for (int i = 0; i < r->g->n_no_decay; i++) ctpu_release(r->g->no_decay[i]);
    free(r->g);
    corpus_free(&r->c);
}

int main(int argc, char **argv)
{
    static run_t r;
    int pr = parse_args(argc, argv, &r.o);
    if (pr) return pr == 1 ? 0 : 2;
    if (r.o.threads > 0) {
        char b[32];
        snprintf(b, sizeof b, "%d", r.o.threads);
        setenv("CTPU_NUM_THREADS", b, 1);
    }
    r.tty = r.o.progress < 0 ? isatty(fileno(stderr)) : r.o.progress == 1;
    if (load_data(&r)) return 1;
    if (data_parallel_init(&r.o, &r.tty)) return 1;
    if (make_model(&r) || open_log_and_banner(&r) || train(&r) || finish(&r)) return 1;
    free_run(&r);
    if (r.o.ddp) ctpu_dist_shutdown();
    else ctpu_shutdown();
    return 0;
}
