/* Fashion-MNIST: an MLP 784-256-128-10 (ReLU) trained with AdamW, in C.
 *
 * The recipe (every part a flag): pixels scaled to [0, 1], then normalised
 * by the training set's mean and std; AdamW lr 1e-3, betas 0.9/0.999, eps
 * 1e-8, weight decay 1e-4; cosine decay of the learning rate to 0 over the
 * run (per batch); batch 128, reshuffled every epoch, the last partial batch
 * kept (60000 = 468 x 128 + 96); 5 epochs; seed 1. bench/torch_mlp.py is the
 * same recipe in PyTorch.
 *
 * The execution mode comes from the environment only (strict eager by
 * default; TORCH_TPU_LAUNCH_BLOCKING=1 debug eager; TORCH_TPU_DEFER_AND_FUSE=1
 * defer and fuse). The training loop reads no value back to the host inside
 * a step: each step's loss is kept on the device and read at the end of the
 * epoch (the progress bar on a terminal reads one every few steps).
 *
 * Checkpoints: --save PATH writes the whole run (weights, AdamW state, the
 * generator's state and the batch iterator's place: ctpu_checkpoint_save, a
 * safetensors file) at the end and, with --save-every K, after every K
 * steps; --resume PATH continues such a run where it stopped, giving the
 * losses the unbroken run would have given, bit for bit (same options
 * needed: the batch, --limit and --seed are checked by the checkpoint,
 * --epochs, --lr, --wd, --betas and --eps by the demo's metadata). The
 * checkpoint also carries the unfinished epoch's train-loss sum, rows and
 * batches, so a resumed epoch's train_loss is the unbroken run's (under
 * --ddp to float rounding: the ranks' sums are added in another order); its
 * time and images_per_s cover the steps this run ran. A run stopped inside an
 * epoch ends that epoch's line with "(stopped after B of N batches)"; a
 * finished run resumed trains nothing and prints its last train_loss.
 *
 * Data parallel: --ddp under mpirun (`mpirun -np 2 ./build/examples/fashion_mnist
 * --ddp`) makes each process a rank of ctpu_dist_init (one emulated chip);
 * --batch stays the global batch: rank r trains on rows [r b / N, (r+1) b / N)
 * of each global batch (the last partial batch split the same way), and the
 * gradients are averaged over the ranks after backward (ctpu_ddp_sync_grads),
 * so the recipe is the one-process run's. Rank 0 prints, logs and saves; the
 * test set is split over the ranks and the hits added up.
 *
 * The last line is machine-readable (its figures depend on the run and
 * the machine; README.md quotes a current one):
 *   result test_accuracy=A train_loss=L epochs=N images_per_s=R compiles=C recompiles=K mode=M [world_size=W]
 * compiles: the programs compiled for the training and evaluation steps up to
 * that line (fused programs in defer and fuse, one-op programs in strict and
 * debug eager; not those that made or loaded the model); recompiles: those of
 * them that compile an operation again for new shapes (fused programs whose
 * structure was cached with other shapes, "recompiles", plus one-op programs
 * whose op signature was first compiled in an earlier step,
 * "strict_recompiles": the last, smaller batch recompiles in every mode). */
#include "demo_util.h"

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

typedef struct {
    const char *data_dir, *log_path, *save_path, *resume_path;
    int epochs, threads;
    int64_t save_every, stop_after;
    int64_t batch, limit, test_limit;
    double lr, wd, beta1, beta2, eps;
    uint64_t seed;
    int progress;   /* -1 auto (a terminal), 0 off, 1 on */
    bool ddp;       /* data parallel over mpirun's ranks */
    bool compile, capturable;   /* the step as a compiled step; AdamW capturable */
    bool dynamic;               /* each batch's dim 0 marked dynamic in [2, batch] */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fashion_mnist [options]\n"
            "Train an MLP 784-256-128-10 on Fashion-MNIST with AdamW (cosine schedule).\n"
            "  --data DIR       dataset directory (default /usr/share/datasets/fashion-mnist)\n"
            "                   with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]\n"
            "  --epochs N       epochs (default 5)\n"
            "  --batch N        batch size (default 128; the last partial batch is kept)\n"
            "  --lr X           peak learning rate (default 1e-3), cosine-decayed to 0\n"
            "  --wd X           AdamW weight decay (default 1e-4)\n"
            "  --betas B1,B2    AdamW betas (default 0.9,0.999)\n"
            "  --eps X          AdamW eps (default 1e-8)\n"
            "  --seed N         seed for the initialisation and the shuffling (default 1)\n"
            "  --threads N      kernel threads (sets CTPU_NUM_THREADS; default: all cores)\n"
            "  --limit N        train on the first N images only (default: all)\n"
            "  --ddp            data parallel: run under mpirun, one emulated chip per process;\n"
            "                   --batch is the global batch, split over the ranks\n"
            "  --test-limit N   evaluate on the first N test images only (default: all)\n"
            "  --log FILE       write the loss curve as CSV (step,epoch,lr,loss)\n"
            "  --save PATH      write a checkpoint (safetensors) of the whole run at the end\n"
            "  --save-every K   ... and after every K steps (needs --save)\n"
            "  --resume PATH    continue the run saved in PATH (same options)\n"
            "  --stop-after N   stop once N steps of the run are done (the schedule still spans --epochs)\n"
            "  --progress / --no-progress   force the progress bar on or off (default: on a terminal)\n"
            "  --compile        the training step as a compiled step (ctpu_compile: captured once,\n"
            "                   replayed with no per-op host work; not with --ddp); implies --capturable\n"
            "  --capturable     AdamW keeps lr and step count as device tensors (torch's\n"
            "                   capturable=True; the numbers --compile gives, in any mode)\n"
            "  --dynamic        each batch's dim 0 dynamic in [2, batch] (ctpu_declare_dynamic_inputs): in defer\n"
            "                   and fuse the last, smaller batch binds the step program instead of recompiling\n"
            "  --help           this text\n"
            "  --version        the program's and the library's version\n"
            "Options take their value as --opt VALUE or --opt=VALUE.\n"
            "The mode comes from the environment: TORCH_TPU_LAUNCH_BLOCKING=1 (debug eager),\n"
            "TORCH_TPU_DEFER_AND_FUSE=1 (defer and fuse); strict eager otherwise.\n");
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

/* An integer option's value: all of s a decimal integer in [lo, hi]. */
static bool parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* "--x" or "--x=v" that getopt_long refused as '?': ambiguous when the
 * name is a prefix of two options (getopt's own message is off). */
static bool ambiguous(const char *arg, const struct option *opts)
{
    if (strncmp(arg, "--", 2) != 0) return false;
    arg += 2;
    size_t n = strcspn(arg, "=");
    int hits = 0;
    for (const struct option *p = opts; p->name; p++) hits += n > 0 && strncmp(p->name, arg, n) == 0;
    return hits > 1;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){ .data_dir = "/usr/share/datasets/fashion-mnist", .epochs = 5, .batch = 128, .lr = 1e-3,
                   .wd = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .seed = 1, .progress = -1 };
    /* getopt_long: "--epochs 1", "--epochs=1" and unique prefixes ("--epo=1") */
    enum { O_DATA = 256, O_LOG, O_BETAS, O_EPOCHS, O_BATCH, O_LR, O_WD, O_EPS, O_SEED, O_THREADS, O_LIMIT,
           O_TEST_LIMIT, O_SAVE, O_SAVE_EVERY, O_RESUME, O_STOP_AFTER, O_PROGRESS, O_NO_PROGRESS, O_VERSION, O_DDP, O_COMPILE, O_CAPTURABLE, O_DYNAMIC };
    static const struct option longopts[] = {
        { "data", required_argument, NULL, O_DATA },       { "log", required_argument, NULL, O_LOG },
        { "betas", required_argument, NULL, O_BETAS },     { "epochs", required_argument, NULL, O_EPOCHS },
        { "batch", required_argument, NULL, O_BATCH },     { "lr", required_argument, NULL, O_LR },
        { "wd", required_argument, NULL, O_WD },           { "eps", required_argument, NULL, O_EPS },
        { "seed", required_argument, NULL, O_SEED },       { "threads", required_argument, NULL, O_THREADS },
        { "limit", required_argument, NULL, O_LIMIT },     { "test-limit", required_argument, NULL, O_TEST_LIMIT },
        { "save", required_argument, NULL, O_SAVE },       { "save-every", required_argument, NULL, O_SAVE_EVERY },
        { "resume", required_argument, NULL, O_RESUME },   { "stop-after", required_argument, NULL, O_STOP_AFTER },
        { "progress", no_argument, NULL, O_PROGRESS },     { "no-progress", no_argument, NULL, O_NO_PROGRESS },
        { "help", no_argument, NULL, 'h' },                { "version", no_argument, NULL, O_VERSION },
        { "ddp", no_argument, NULL, O_DDP },
        { "compile", no_argument, NULL, O_COMPILE }, { "capturable", no_argument, NULL, O_CAPTURABLE },
        { "dynamic", no_argument, NULL, O_DYNAMIC },
        { NULL, 0, NULL, 0 },
    };
    opterr = 0;   /* our own messages, naming the option */
    optind = 1;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", longopts, &li)) != -1) {
        const char *name = li >= 0 ? longopts[li].name : "?";
        const char *v = optarg;
        double x = 0;
        bool ok = true;
        switch (c) {
        case 'h': usage(stdout); return 1;
        case O_VERSION: printf("fashion_mnist (ctpu %s)\n", ctpu_version()); return 1;
        case O_PROGRESS: o->progress = 1; break;
        case O_NO_PROGRESS: o->progress = 0; break;
        case O_DDP: o->ddp = true; break;
        case O_COMPILE: o->compile = o->capturable = true; break;
        case O_CAPTURABLE: o->capturable = true; break;
        case O_DYNAMIC: o->dynamic = true; break;
        case O_DATA: o->data_dir = v; break;
        case O_LOG: o->log_path = v; break;
        case O_SAVE: o->save_path = v; break;
        case O_RESUME: o->resume_path = v; break;
        case O_BETAS: {   /* torch.optim.AdamW: 0 <= beta < 1 */
            int used = -1;
            ok = sscanf(v, "%lf,%lf%n", &o->beta1, &o->beta2, &used) == 2 && used == (int)strlen(v) &&
                 o->beta1 >= 0 && o->beta1 < 1 && o->beta2 >= 0 && o->beta2 < 1;
            break;
        }
        case ':':
            fprintf(stderr, "fashion_mnist: %s needs a value (see --help)\n", argv[optind - 1]);
            return 2;
        case '?':
            fprintf(stderr, "fashion_mnist: %s option %s (see --help)\n",
                    ambiguous(argv[optind - 1], longopts) ? "ambiguous" : "unknown", argv[optind - 1]);
            return 2;
        case O_LR: ok = parse_num(v, &x) && x > 0 && isfinite(x); o->lr = x; break;
        case O_WD: ok = parse_num(v, &x) && x >= 0 && isfinite(x); o->wd = x; break;
        case O_EPS: ok = parse_num(v, &x) && x > 0 && isfinite(x); o->eps = x; break;
        case O_SEED: {
            char *end;
            errno = 0;
            unsigned long long u = strtoull(v, &end, 10);
            ok = !errno && end != v && !*end && v[strspn(v, " ")] != '-';
            o->seed = u;
            break;
        }
        default: {   /* the integer options */
            long long n = 0;
            switch (c) {
            case O_EPOCHS: ok = parse_int(v, 1, 1000000, &n); o->epochs = (int)n; break;
            case O_BATCH: ok = parse_int(v, 1, INT64_MAX, &n); o->batch = n; break;
            case O_THREADS: ok = parse_int(v, 1, 64, &n); o->threads = (int)n; break;
            case O_LIMIT: ok = parse_int(v, 1, INT64_MAX, &n); o->limit = n; break;
            case O_TEST_LIMIT: ok = parse_int(v, 1, INT64_MAX, &n); o->test_limit = n; break;
            case O_SAVE_EVERY: ok = parse_int(v, 1, INT64_MAX, &n); o->save_every = n; break;
            case O_STOP_AFTER: ok = parse_int(v, 1, INT64_MAX, &n); o->stop_after = n; break;
            default: ok = false; break;
            }
        }
        }
        if (!ok) { fprintf(stderr, "fashion_mnist: bad value '%s' for --%s (see --help)\n", v, name); return 2; }
        li = -1;
    }
    if (optind < argc) {
        fprintf(stderr, "fashion_mnist: unexpected argument %s (see --help)\n", argv[optind]);
        return 2;
    }
    if (o->save_every && !o->save_path) {
        fprintf(stderr, "fashion_mnist: --save-every needs --save PATH (see --help)\n");
        return 2;
    }
    return 0;
}

static double now_s(void) { return demo_now_s(); }
static int fail(const char *what) { return demo_fail("fashion_mnist", what); }

static ctpu_status load_split(const char *dir, const char *split, ctpu_image_set *s)
{
    char ip[4096], lp[4096];
    const char *ikind = "images-idx3-ubyte", *lkind = "labels-idx1-ubyte";
    snprintf(ip, sizeof ip, "%s/%s-%s.gz", dir, split, ikind);
    snprintf(lp, sizeof lp, "%s/%s-%s.gz", dir, split, lkind);
    if (access(ip, R_OK) != 0) snprintf(ip, sizeof ip, "%s/%s-%s", dir, split, ikind);
    if (access(lp, R_OK) != 0) snprintf(lp, sizeof lp, "%s/%s-%s", dir, split, lkind);
    return ctpu_image_set_load(ip, lp, 10, s);
}

typedef struct { ctpu_linear fc1, fc2, fc3; } mlp;

static ctpu_tensor mlp_forward(const mlp *m, ctpu_tensor x);

/* The training step as a ctpu_step_fn (--compile): in = {x, y}, scalars =
 * {lr}, out = {loss}. */
typedef struct { const mlp *m; ctpu_optim *opt; } step_ctx;
static ctpu_status train_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    step_ctx *s = ctx;
    ctpu_optim_zero_grad(s->opt);
    ctpu_tensor loss = ctpu_cross_entropy(mlp_forward(s->m, in[0]), in[1], NULL);
    ctpu_status st = ctpu_is_null(loss) ? ctpu_last_status() : ctpu_backward(loss);
    if (st == CTPU_OK) st = ctpu_optim_set_lr(s->opt, sc[0]);
    if (st == CTPU_OK) st = ctpu_optim_step(s->opt);
    out[0] = loss;
    return st;
}

static ctpu_tensor mlp_forward(const mlp *m, ctpu_tensor x)
{
    ctpu_tensor h = ctpu_relu(ctpu_linear_forward(&m->fc1, x));
    h = ctpu_relu(ctpu_linear_forward(&m->fc2, h));
    return ctpu_linear_forward(&m->fc3, h);
}

/* Test hits over rows [lo, hi), counted on the device, read once. */
static ctpu_status evaluate_rows(const mlp *m, const ctpu_image_set *test, int64_t lo, int64_t hi, double *hits)
{
    ctpu_no_grad_begin();
    ctpu_scope_begin();
    ctpu_tensor correct = ctpu_zeros(CTPU_F32, 0, NULL);
    int64_t *idx = malloc(sizeof(int64_t) * 1000);
    ctpu_status st = idx ? CTPU_OK : CTPU_ERR_OOM;
    for (int64_t at = lo; st == CTPU_OK && at < hi; at += 1000) {
        int64_t k = hi - at < 1000 ? hi - at : 1000;
        for (int64_t i = 0; i < k; i++) idx[i] = at + i;
        ctpu_step_begin();
        ctpu_tensor x, y;
        st = ctpu_image_set_batch(test, idx, k, &x, &y);
        if (st == CTPU_OK) {
            ctpu_tensor hit = ctpu_eq(ctpu_argmax(mlp_forward(m, x), 1, false), y);
            st = ctpu_assign(correct, ctpu_add(correct, ctpu_sum(hit, 0, NULL, false)));
        }
        ctpu_step_end();
    }
    double c = 0;
    if (st == CTPU_OK) st = ctpu_item(correct, &c);
    free(idx);
    ctpu_scope_end();
    ctpu_no_grad_end();
    *hits = c;
    return st;
}

/* Sum of (a, b) over the ranks (one all_reduce; a world of one rank: (a, b)). */
static ctpu_status sum_over_ranks(double *a, double *b)
{
    if (ctpu_dist_world_size() == 1) return CTPU_OK;
    float v[2] = { (float)*a, (float)*b }, r[2];
    int64_t two = 2;
    ctpu_scope_begin();
    ctpu_status st = ctpu_to_host(ctpu_all_reduce(ctpu_from_host(v, CTPU_F32, 1, &two), CTPU_DIST_SUM), r, sizeof r);
    ctpu_scope_end();
    *a = r[0];
    *b = r[1];
    return st;
}

/* Test accuracy of the first n test images (split over the ranks). */
static ctpu_status evaluate(const mlp *m, const ctpu_image_set *test, int64_t n, double *acc)
{
    int64_t lo, hi;
    ctpu_ddp_shard(n, ctpu_dist_rank(), ctpu_dist_world_size(), &lo, &hi);
    double hits = 0, rows = (double)(hi - lo);
    ctpu_status st = evaluate_rows(m, test, lo, hi, &hits);
    if (st == CTPU_OK) st = sum_over_ranks(&hits, &rows);
    *acc = rows > 0 ? hits / rows : 0;
    return st;
}

static void progress_bar(int epoch, int epochs, int64_t done, int64_t total, double loss, double ips)
{
    int w = 30, fill = total ? (int)(w * done / total) : w;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[w] = 0;
    fprintf(stderr, "\repoch %d/%d [%s] %lld/%lld loss %.4f %6.0f img/s ", epoch, epochs, bar, (long long)done,
            (long long)total, loss, ips);
    fflush(stderr);
}

/* One run's state, shared by main and the epoch loop. */
typedef struct {
    const opts_t *o;
    mlp *m;
    ctpu_optim *opt;
    ctpu_compiled *cstep;   /* NULL without --compile */
    ctpu_ddp *ddp;          /* NULL without --ddp */
    ctpu_batch_iter *it;
    ctpu_image_set *train, *test;
    int64_t n_test, per_epoch, total, step, images;
    int rank, world;
    bool tty;
    FILE *log;
    const char *const *names;
    ctpu_tensor params[6];
    step_ctx sctx;         /* the compiled step's ctx */
    ctpu_tensor *losses;   /* per_epoch entries each */
    int64_t *sizes;
    double *lrs;
    double *lvals;         /* the epoch's losses read so far (per_epoch entries) */
    int64_t nread;         /* losses[0, nread) of this run's epoch are read into lvals */
    /* the epoch's train-loss sum and row count over its batches read so far,
     * and its batch count, all counting the batches before a --resume (the
     * checkpoint carries them), so a resumed epoch's train_loss is the
     * unbroken run's */
    double esum, erows;
    int64_t ebatches;
    double epoch_loss;     /* the last complete epoch's train loss (NaN: none yet) */
    double train_time, train_loss, acc;
    bool evaluated, stopped;
} run_t;

/* Read this run's epoch losses [nread, nb) (waits for the device) into lvals
 * and the epoch's sum; under --ddp the sum is this rank's. */
static int read_losses(run_t *r, int64_t nb)
{
    for (int64_t i = r->nread; i < nb; i++) {
        double l;
        if (ctpu_item(r->losses[i], &l) != CTPU_OK) return fail("reading the losses");
        ctpu_release(r->losses[i]);
        r->lvals[i] = l;
        r->esum += l * (double)r->sizes[i];
        r->erows += (double)r->sizes[i];
    }
    r->nread = nb;
    return 0;
}

/* The checkpoint: the run (ctpu_checkpoint_save) plus the demo's metadata:
 * the recipe (checked on --resume) and the unfinished epoch's loss sum, rows
 * and batches (%.17g: a double reads back exactly). Under --ddp every rank
 * calls it (the partial sum is added up over the ranks; rank 0 writes). */
static int save_run(run_t *r, int64_t nb)
{
    const opts_t *o = r->o;
    int rc = read_losses(r, nb);
    if (rc) return rc;
    double sum = r->esum, rows = r->erows;
    if (sum_over_ranks(&sum, &rows) != CTPU_OK) return fail("adding up the losses");
    if (r->rank != 0) return 0;
    char v[5][256];
    snprintf(v[0], sizeof v[0], "%.17g", sum);
    snprintf(v[1], sizeof v[1], "%.17g", rows);
    snprintf(v[2], sizeof v[2], "%lld", (long long)r->ebatches);
    snprintf(v[3], sizeof v[3], "%.17g", r->epoch_loss);
    snprintf(v[4], sizeof v[4], "--epochs %d --lr %.12g --wd %.12g --betas %.12g,%.12g --eps %.12g", o->epochs, o->lr, o->wd,
             o->beta1, o->beta2, o->eps);
    const char *meta[12] = { "demo", "fashion_mnist", "fashion_mnist.epoch_sum", v[0], "fashion_mnist.epoch_rows", v[1],
                             "fashion_mnist.epoch_batches", v[2], "fashion_mnist.train_loss", v[3],
                             "fashion_mnist.recipe", v[4] };
    if (ctpu_checkpoint_save(o->save_path, 6, r->names, r->params, r->opt, r->it, 6, meta) != CTPU_OK)
        return fail("saving a checkpoint");
    return 0;
}

/* --resume's demo metadata (save_run's): false with a message naming the key. */
static bool resume_meta(run_t *r)
{
    const opts_t *o = r->o;
    ctpu_safetensors *f = ctpu_safetensors_open(o->resume_path);
    if (!f) {   /* missing, unreadable or not a safetensors file: the library's message says which */
        fprintf(stderr, "fashion_mnist: --resume: %s\n", ctpu_last_error());
        return false;
    }
    char want[256];
    snprintf(want, sizeof want, "--epochs %d --lr %.12g --wd %.12g --betas %.12g,%.12g --eps %.12g", o->epochs, o->lr, o->wd,
             o->beta1, o->beta2, o->eps);
    const char *keys[5] = { "fashion_mnist.epoch_sum", "fashion_mnist.epoch_rows", "fashion_mnist.epoch_batches",
                            "fashion_mnist.train_loss", "fashion_mnist.recipe" };
    double d[4] = { 0 };
    bool ok = true;
    for (int i = 0; i < 5 && ok; i++) {
        const char *v = ctpu_safetensors_metadata(f, keys[i]);
        char *end = NULL;
        if (v && i < 4) d[i] = strtod(v, &end);
        ok = v && (i == 4 || (end != v && !*end));
        if (!ok) fprintf(stderr, "fashion_mnist: %s: %s metadata \"%s\" (not a checkpoint of this fashion_mnist?)\n",
                         o->resume_path, v ? "malformed" : "no", keys[i]);
        else if (i == 4 && strcmp(v, want) != 0) {
            fprintf(stderr, "fashion_mnist: %s was saved with %s, not %s (--resume needs the same options)\n",
                    o->resume_path, v, want);
            ok = false;
        }
    }
    ctpu_safetensors_close(f);
    if (!ok) return false;
    if (r->rank == 0) {   /* the ranks' sum, added once */
        r->esum = d[0];
        r->erows = d[1];
    }
    r->ebatches = (int64_t)d[2];
    r->epoch_loss = d[3];
    return true;
}

/* One training step on the global batch's rows idx[0..k): this rank's shard,
 * forward, backward, the gradients' all_reduce with --ddp, the AdamW update
 * (or the compiled step doing all of it). The loss stays on the device. */
static int train_batch(run_t *r, const int64_t *idx, int64_t k, double lr, ctpu_tensor *loss_out, int64_t *rows)
{
    ctpu_optim_zero_grad(r->opt);
    ctpu_step_begin();
    int64_t lo = 0, hi = k;   /* this rank's rows of the global batch */
    if (r->ddp) {
        ctpu_ddp_shard(k, r->rank, r->world, &lo, &hi);
        if (hi == lo) { fprintf(stderr, "fashion_mnist: a batch of %lld rows for %d ranks\n", (long long)k, r->world); return 1; }
        ctpu_ddp_step_begin(r->ddp);
    }
    ctpu_tensor x, y, loss;
    if (ctpu_image_set_batch(r->train, idx + lo, hi - lo, &x, &y) != CTPU_OK) return fail("batch");
    if (r->cstep) {
        if (ctpu_compiled_call(r->cstep, 2, (ctpu_tensor[]){ x, y }, 1, &lr, 1, &loss) != CTPU_OK)
            return fail("compiled step");
    } else {
        loss = ctpu_cross_entropy(mlp_forward(r->m, x), y, NULL);
        if (ctpu_is_null(loss)) return fail("forward");
        if (ctpu_backward(loss) != CTPU_OK) return fail("backward");
        if (r->ddp && ctpu_ddp_sync_grads(r->ddp) != CTPU_OK) return fail("averaging the gradients");
        ctpu_optim_set_lr(r->opt, lr);
        if (ctpu_optim_step(r->opt) != CTPU_OK) return fail("optimizer step");
    }
    *loss_out = ctpu_keep(ctpu_detach(loss));
    ctpu_step_end();
    *rows = hi - lo;
    return 0;
}

/* One epoch: its batches, then one read of their losses (waits for the
 * device), the log lines, the evaluation and the epoch line. Returns 0 or
 * the process's exit status. */
static int train_epoch(run_t *r, int ep)
{
    const opts_t *o = r->o;
    double t0 = now_s();
    int64_t nb = 0, seen = 0, k;
    int rc;
    const int64_t *idx;
    while (!(r->stopped = o->stop_after && r->step >= o->stop_after) && (k = ctpu_batch_iter_next(r->it, &idx)) > 0) {
        double lr = ctpu_lr_cosine(o->lr, r->step, r->total, 0.0);
        if ((rc = train_batch(r, idx, k, lr, &r->losses[nb], &r->sizes[nb]))) return rc;
        r->lrs[nb] = lr;
        nb++;
        seen += k;
        r->step++;
        r->ebatches++;
        if (o->save_every && r->step % o->save_every == 0 && (rc = save_run(r, nb))) return rc;
        if (r->tty && (nb % 25 == 0 || nb == r->per_epoch)) {
            double l = nb <= r->nread ? r->lvals[nb - 1] : 0;   /* read already if a save just read it */
            if (nb > r->nread && ctpu_item(r->losses[nb - 1], &l) != CTPU_OK) return fail("reading the loss");
            progress_bar(ep + 1, o->epochs, nb, r->per_epoch, l, (double)seen / (now_s() - t0));
        }
    }
    if ((rc = read_losses(r, nb))) return rc;
    for (int64_t i = 0; i < nb; i++)
        if (r->log) fprintf(r->log, "%lld,%d,%.9g,%.9g\n", (long long)(r->step - nb + i), ep + 1, r->lrs[i], r->lvals[i]);
    r->nread = 0;
    if (nb == 0) return 0;   /* resumed at the end of this epoch's batches, or stopped */
    double sum = r->esum, rows = r->erows;
    if (sum_over_ranks(&sum, &rows) != CTPU_OK) return fail("adding up the losses");
    bool whole = r->ebatches == r->per_epoch;
    double dt = now_s() - t0;
    r->train_time += dt;
    r->images += seen;
    r->train_loss = rows > 0 ? sum / rows : NAN;
    if (whole) {   /* the next epoch starts from nothing */
        r->epoch_loss = r->train_loss;
        r->esum = r->erows = 0;
        r->ebatches = 0;
    }
    if (r->tty) fprintf(stderr, "\n");
    if (evaluate(r->m, r->test, r->n_test, &r->acc) != CTPU_OK) return fail("evaluation");
    r->evaluated = true;
    char part[64] = "";
    if (!whole) snprintf(part, sizeof part, " (stopped after %lld of %lld batches)", (long long)r->ebatches,
                         (long long)r->per_epoch);
    printf("epoch %d/%d train_loss=%.4f test_accuracy=%.4f time=%.2fs images_per_s=%.0f%s\n", ep + 1, o->epochs,
           r->train_loss, r->acc, dt, (double)seen / dt, part);
    fflush(stdout);
    return 0;
}

/* The model, the optimizer, the compiled step, the DDP wrapper and the batch
 * iterator; --resume's state. Returns 0 or the process's exit status. */
static int make_run(run_t *r, mlp *m, int *first_epoch)
{
    const opts_t *o = r->o;
    ctpu_manual_seed(o->seed);
    int64_t px = r->train->rows * r->train->cols;
    if (ctpu_linear_init(&m->fc1, px, 256, true, CTPU_F32) != CTPU_OK ||
        ctpu_linear_init(&m->fc2, 256, 128, true, CTPU_F32) != CTPU_OK ||
        ctpu_linear_init(&m->fc3, 128, 10, true, CTPU_F32) != CTPU_OK)
        return fail("making the model");
    ctpu_tensor ps[6] = { m->fc1.weight, m->fc1.bias, m->fc2.weight, m->fc2.bias, m->fc3.weight, m->fc3.bias };
    memcpy(r->params, ps, sizeof ps);
    r->m = m;
    ctpu_adamw_opts ao = { o->lr, o->beta1, o->beta2, o->eps, o->wd };
    r->opt = ctpu_adamw_create(6, r->params, &ao);
    if (!r->opt) return fail("making the optimizer");
    if (o->capturable && ctpu_optim_set_capturable(r->opt, true) != CTPU_OK) return fail("making the optimizer");
    r->sctx = (step_ctx){ m, r->opt };
    r->cstep = o->compile ? ctpu_compile(train_step, &r->sctx, &(ctpu_compile_opts){ .name = "fashion_mnist.train_step" })
                          : NULL;
    if (o->compile && !r->cstep) return fail("compiling the step");
    if (o->ddp && !(r->ddp = ctpu_ddp_create(6, r->params, NULL))) return fail("making the DDP wrapper");
    r->it = ctpu_batch_iter_create(r->train->n, o->batch, true, false, o->seed);
    if (!r->it) return fail("making the batch iterator");
    r->per_epoch = ctpu_batch_iter_batches_per_epoch(r->it);
    r->total = r->per_epoch * o->epochs;
    ctpu_set_steps_per_epoch(r->per_epoch);   /* the cost table's per-epoch figures */
    static const char *const names[6] = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias" };
    r->names = names;
    *first_epoch = 0;
    r->epoch_loss = NAN;
    if (o->resume_path) {
        if (!resume_meta(r)) return 1;
        if (ctpu_checkpoint_load(o->resume_path, 6, names, r->params, r->opt, r->it) != CTPU_OK) return fail("resuming");
        ctpu_batch_iter_state bs;
        ctpu_batch_iter_get_state(r->it, &bs);
        *first_epoch = (int)bs.epoch;
        printf("fashion_mnist: resumed %s at step %lld (epoch %d, %lld images into it)\n", o->resume_path,
               (long long)ctpu_optim_steps(r->opt), *first_epoch + 1, (long long)bs.position);
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr == 1 ? 0 : 2;
    if (o.compile && o.ddp) {
        fprintf(stderr, "fashion_mnist: --compile with --ddp: the gradients' all_reduce would be a graph break\n");
        return 2;
    }
    if (o.threads > 0) {
        char b[32];
        snprintf(b, sizeof b, "%d", o.threads);
        setenv("CTPU_NUM_THREADS", b, 1);
    }
    run_t r = { .o = &o };
    r.tty = o.progress < 0 ? isatty(fileno(stderr)) : o.progress == 1;
    if ((o.ddp ? ctpu_dist_init() : ctpu_init()) != CTPU_OK) return fail("init");
    r.rank = ctpu_dist_rank();
    r.world = ctpu_dist_world_size();
    if (r.rank != 0) {   /* rank 0 speaks for the job */
        if (!freopen("/dev/null", "w", stdout)) return fail("silencing stdout");
        r.tty = false;
        o.log_path = NULL;
    }

    ctpu_image_set train, test;
    if (load_split(o.data_dir, "train", &train) != CTPU_OK) return fail("loading the training set");
    if (load_split(o.data_dir, "t10k", &test) != CTPU_OK) return fail("loading the test set");
    if (o.limit > 0 && o.limit < train.n) train.n = o.limit;
    r.train = &train;
    r.test = &test;
    r.n_test = o.test_limit > 0 && o.test_limit < test.n ? o.test_limit : test.n;
    double mean, std;
    ctpu_image_set_stats(&train, &mean, &std);
    ctpu_image_set_normalize(&train, mean, std);
    ctpu_image_set_normalize(&test, mean, std);

    mlp m;
    int first_epoch, rc = make_run(&r, &m, &first_epoch);
    if (rc) return rc;
    if (o.log_path) {
        r.log = fopen(o.log_path, "w");
        if (!r.log) { fprintf(stderr, "fashion_mnist: cannot write %s: %s\n", o.log_path, strerror(errno)); return 1; }
        fprintf(r.log, "step,epoch,lr,loss\n");
    }
    /* TORCH_COMPILE_DISABLE=1 (the runtime's switch): --compile's step runs
     * fn in the current mode, and the result line names that mode */
    const char *cdis = getenv("TORCH_COMPILE_DISABLE");
    bool compile_off = o.compile && cdis && strcmp(cdis, "1") == 0;
    const char *mode = o.compile && !compile_off ? "compiled" : ctpu_mode_name(ctpu_get_mode());
    if (compile_off)
        printf("fashion_mnist: --compile with TORCH_COMPILE_DISABLE=1: compilation disabled, the step runs in mode %s\n",
               mode);
    printf("fashion_mnist: %lld train / %lld test images, MLP %lld-256-128-10, AdamW lr %g wd %g, batch %lld, "
           "%d epochs, seed %llu, mode %s%s\n", (long long)train.n, (long long)r.n_test,
           (long long)(train.rows * train.cols), o.lr, o.wd, (long long)o.batch, o.epochs,
           (unsigned long long)o.seed, mode, o.ddp ? ", DDP" : "");
    if (o.ddp) printf("fashion_mnist: data parallel over %d ranks (global batch %lld)\n", r.world, (long long)o.batch);
    fflush(stdout);

    r.losses = malloc(sizeof(ctpu_tensor) * (size_t)r.per_epoch);
    r.sizes = malloc(sizeof(int64_t) * (size_t)r.per_epoch);
    r.lrs = malloc(sizeof(double) * (size_t)r.per_epoch);
    r.lvals = malloc(sizeof(double) * (size_t)r.per_epoch);
    if (!r.losses || !r.sizes || !r.lrs || !r.lvals) { fprintf(stderr, "fashion_mnist: out of memory\n"); return 1; }
    r.step = ctpu_optim_steps(r.opt);
    if (ctpu_sync() != CTPU_OK) return fail("making the model");   /* a pending trace compiles here, not below */
    /* --dynamic: each batch is a new tensor; the images [n, 784] and labels [n] ctpu_image_set_batch
     * makes from here on come with n marked dynamic in [2, batch] (after the parameters are made) */
    if (o.dynamic && o.batch >= 2 &&
        (ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 2, o.batch) != CTPU_OK ||
         ctpu_declare_dynamic_inputs(CTPU_I32, 1, 0, 2, o.batch) != CTPU_OK))
        return fail("declaring the batches dynamic");
    int64_t compiles0 = ctpu_metric_counter("programs_compiled"), recompiles0 = ctpu_metric_counter("recompiles") + ctpu_metric_counter("strict_recompiles");
    for (int ep = first_epoch; ep < o.epochs && !r.stopped; ep++)
        if ((rc = train_epoch(&r, ep))) return rc;
    if (r.log) fclose(r.log);
    if (!r.evaluated) r.train_loss = r.epoch_loss;   /* nothing trained: the checkpoint's last epoch, or NaN */
    if (!r.evaluated && evaluate(&m, &test, r.n_test, &r.acc) != CTPU_OK) return fail("evaluation");
    if (o.save_path) {
        if ((rc = save_run(&r, 0))) return rc;
        printf("fashion_mnist: saved %s at step %lld\n", o.save_path, (long long)r.step);
    }
    demo_print_compiled(r.cstep);
    char ws[32] = "";
    if (o.ddp) snprintf(ws, sizeof ws, " world_size=%d", r.world);
    printf("result test_accuracy=%.4f train_loss=%.4f epochs=%d images_per_s=%.0f compiles=%lld recompiles=%lld "
           "mode=%s%s\n", r.acc, r.train_loss, o.epochs, r.train_time > 0 ? (double)r.images / r.train_time : 0.0,
           (long long)(ctpu_metric_counter("programs_compiled") - compiles0),
           (long long)(ctpu_metric_counter("recompiles") + ctpu_metric_counter("strict_recompiles") - recompiles0),
           mode, ws);
    /* the compile-cache report and the TPU cost table, on stderr (stdout's last line stays the result) */
    fflush(stdout);
    if (r.rank == 0) ctpu_cache_report(stderr);   /* with --ddp: compute against communication, estimated */
    ctpu_ddp_free(r.ddp);
    free(r.losses);
    free(r.sizes);
    free(r.lrs);
    free(r.lvals);
    ctpu_batch_iter_free(r.it);
    ctpu_compiled_free(r.cstep);   /* the caller owns a compiled step (NULL without --compile) */
    ctpu_optim_free(r.opt);
    ctpu_linear_free(&m.fc1);
    ctpu_linear_free(&m.fc2);
    ctpu_linear_free(&m.fc3);
    ctpu_image_set_free(&train);
    ctpu_image_set_free(&test);
    if (o.ddp) ctpu_dist_shutdown();
    else ctpu_shutdown();
    return 0;
}
