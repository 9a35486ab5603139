/* A deterministic short training run (seeded, 1,000 images: the first
 * Fashion-MNIST training images when the Debian package is installed, else
 * a synthetic 10-class set): an MLP 784-64-10 with AdamW and a cosine
 * schedule, batch 100, 2 epochs.
 * - the loss sequence is bit-identical in strict eager, debug eager and
 *   defer and fuse (and between two strict runs), and it falls;
 * - step 1 and step 2 record the same op sequence (the autograd hook sees
 *   every op and view), and step 2 compiles no new program;
 * - the loop leaves no HBM behind once the model and optimizer are freed. */
#include <unistd.h>

#include "t_core.h"
#include "ctpu_nn.h"

#define N_IMG 1000
#define BATCH 100
#define EPOCHS 2
#define STEPS (N_IMG / BATCH * EPOCHS)

static ctpu_image_set data;

static void load_data(void)
{
    const char *d = "/usr/share/datasets/fashion-mnist";
    char ip[256], lp[256];
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", d);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", d);
    if (access(ip, R_OK) == 0 && access(lp, R_OK) == 0) {
        ck_assert_msg(ctpu_image_set_load(ip, lp, 10, &data) == CTPU_OK, "%s", ctpu_last_error());
        data.n = N_IMG;
    } else {
        /* synthetic: class c lights up a band of rows, plus noise */
        data.n = N_IMG;
        data.rows = data.cols = 28;
        data.images = malloc(sizeof(float) * N_IMG * 784);
        data.labels = malloc(sizeof(int32_t) * N_IMG);
        uint64_t s = 12345;
        for (int i = 0; i < N_IMG; i++) {
            int c = i % 10;
            data.labels[i] = c;
            for (int p = 0; p < 784; p++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                float noise = (float)(s >> 40) * 0x1p-24f * 0.5f;
                data.images[i * 784 + p] = ((p / 28) / 3 == c ? 0.8f : 0.0f) + noise;
            }
        }
    }
    double mean, std;
    ctpu_image_set_stats(&data, &mean, &std);
    ctpu_image_set_normalize(&data, mean, std);
}

static void setup(void)
{
    t_setup();
    load_data();
}

static void teardown(void)
{
    ctpu_image_set_free(&data);
    t_teardown();
}

typedef struct {
    float loss[STEPS];
    uint64_t ops[2][4096];
    size_t n_ops[2];
    int64_t compiled_step2;
} run_out;

/* One training run in mode m; fills out. */
static void train(ctpu_mode m, run_out *out)
{
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    ctpu_manual_seed(1);
    ctpu_linear fc1, fc2;
    ck_assert_int_eq(ctpu_linear_init(&fc1, 784, 64, true, CTPU_F32), CTPU_OK);
    ck_assert_int_eq(ctpu_linear_init(&fc2, 64, 10, true, CTPU_F32), CTPU_OK);
    ctpu_tensor params[4] = { fc1.weight, fc1.bias, fc2.weight, fc2.bias };
    ctpu_adamw_opts ao = { 3e-3, 0.9, 0.999, 1e-8, 1e-4 };
    ctpu_optim *opt = ctpu_adamw_create(4, params, &ao);
    ck_assert_ptr_nonnull(opt);
    ctpu_batch_iter *it = ctpu_batch_iter_create(data.n, BATCH, true, false, 1);
    ctpu_tensor kept[STEPS];
    int step = 0;
    for (int ep = 0; ep < EPOCHS; ep++) {
        const int64_t *idx;
        int64_t k;
        while ((k = ctpu_batch_iter_next(it, &idx)) > 0) {
            int64_t c0 = ctpu_metric_counter("programs_compiled");
            if (step < 2) ctpu__test_op_trace(out->ops[step], 4096);
            ctpu_optim_zero_grad(opt);
            ctpu_step_begin();
            ctpu_tensor x, y;
            ck_assert_int_eq(ctpu_image_set_batch(&data, idx, k, &x, &y), CTPU_OK);
            ctpu_tensor h = ctpu_relu(ctpu_linear_forward(&fc1, x));
            ctpu_tensor loss = ctpu_cross_entropy(ctpu_linear_forward(&fc2, h), y, NULL);
            ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
            ctpu_optim_set_lr(opt, ctpu_lr_cosine(ao.lr, step, STEPS, 0));
            ck_assert_msg(ctpu_optim_step(opt) == CTPU_OK, "step: %s", ctpu_last_error());
            kept[step] = ctpu_keep(ctpu_detach(loss));
            ctpu_step_end();
            if (step < 2) {
                out->n_ops[step] = ctpu__test_op_trace_len();
                ctpu__test_op_trace(NULL, 0);
            }
            if (step == 1) out->compiled_step2 = ctpu_metric_counter("programs_compiled") - c0;
            step++;
        }
    }
    ck_assert_int_eq(step, STEPS);
    for (int i = 0; i < STEPS; i++) {
        ck_assert_int_eq(ctpu_to_host(kept[i], &out->loss[i], 4), CTPU_OK);
        ctpu_release(kept[i]);
    }
    ctpu_batch_iter_free(it);
    ctpu_optim_free(opt);
    ctpu_linear_free(&fc1);
    ctpu_linear_free(&fc2);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}

static run_out r_strict, r_debug, r_again, r_fuse;

START_TEST(t_strict_debug_identical)
{
    train(CTPU_MODE_STRICT, &r_strict);
    train(CTPU_MODE_DEBUG, &r_debug);
    train(CTPU_MODE_STRICT, &r_again);
    train(CTPU_MODE_DEFER_FUSE, &r_fuse);
    for (int i = 0; i < STEPS; i++) {
        ck_assert_msg(t_same(r_strict.loss[i], r_fuse.loss[i]), "step %d: strict %.9g, defer and fuse %.9g", i,
                      r_strict.loss[i], r_fuse.loss[i]);
        ck_assert_msg(t_same(r_strict.loss[i], r_debug.loss[i]), "step %d: strict %.9g, debug %.9g", i,
                      r_strict.loss[i], r_debug.loss[i]);
        ck_assert_msg(t_same(r_strict.loss[i], r_again.loss[i]), "step %d: two strict runs differ", i);
    }
    /* the loss falls: the last 5 steps average well below the first 5 */
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++) { first += r_strict.loss[i] / 5; last += r_strict.loss[STEPS - 1 - i] / 5; }
    ck_assert_msg(r_strict.loss[0] > 2.0 && last < 0.75 * first, "loss %.4f -> %.4f", first, last);
    ck_assert_msg(isfinite(last), "loss is not finite");
}
END_TEST

START_TEST(t_step1_step2_same_ops)
{
    train(CTPU_MODE_STRICT, &r_strict);
    ck_assert(r_strict.n_ops[0] > 20 && r_strict.n_ops[0] < 4096);
    ck_assert_uint_eq(r_strict.n_ops[0], r_strict.n_ops[1]);
    for (size_t i = 0; i < r_strict.n_ops[0]; i++)
        ck_assert_msg(r_strict.ops[0][i] == r_strict.ops[1][i], "op %zu differs: %s vs %s", i,
                      ctpu_op_name((int)(r_strict.ops[0][i] & 0xffff)), ctpu_op_name((int)(r_strict.ops[1][i] & 0xffff)));
    ck_assert_int_eq(r_strict.compiled_step2, 0);
}
END_TEST

START_TEST(t_no_leak)
{
    ctpu_hbm_stats s;
    train(CTPU_MODE_STRICT, &r_strict);
    ctpu_sync();
    ck_assert_int_eq(ctpu_hbm_get_stats(&s), CTPU_OK);
    ck_assert_uint_eq(s.in_use, 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, t_strict_debug_identical);
    tcase_add_test(tc, t_step1_step2_same_ops);
    tcase_add_test(tc, t_no_leak);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
