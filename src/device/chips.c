/* Chip profiles from public figures (Google Cloud TPU documentation, system
 * architecture pages for each generation, and the Cloud TPU pricing page,
 * on-demand, us-central region). One table; the cost model and the HBM cap
 * read it. */
#include "device.h"

static const ctpu_chip_info profiles[] = {
    { "v5e", 128, 4, 1, 16ull << 30, 819.0, 197e12, 1.20,
      "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s, "
      "1 TensorCore with 4 MXUs (128x128); pricing page: $1.20/chip-hour on demand" },
    { "v5p", 128, 4, 2, 95ull << 30, 2765.0, 459e12, 4.20,
      "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, "
      "2 TensorCores with 4 MXUs each (128x128); pricing page: $4.20/chip-hour on demand" },
    { "v6e", 256, 2, 1, 32ull << 30, 1640.0, 918e12, 2.70,
      "cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GiB HBM at 1640 GB/s, "
      "1 TensorCore, 256x256 MXUs; pricing page: $2.70/chip-hour on demand" },
    { "7x", 256, 2, 2, 192ull << 30, 7370.0, 2307e12, 0.0,
      "cloud.google.com/tpu/docs/tpu7x (Ironwood): 2307 TFLOP/s bf16, 192 GiB HBM3e at "
      "7.37 TB/s, 2 TensorCores, 256x256 MXUs; no public on-demand price (0 = unknown)" },
};

const ctpu_chip_info *ctpu_chip_profiles(int *count)
{
    *count = (int)(sizeof profiles / sizeof profiles[0]);
    return profiles;
}
