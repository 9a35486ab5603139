/* Chip profiles from public figures: Google Cloud TPU documentation (the
 * system architecture page of each generation) and the Cloud TPU pricing
 * page (checked 2026-10-25), per chip-hour in the region each price is
 * quoted for, for the four plans (on demand, DWS Flex-start, 1-year and
 * 3-year commitments). One table; the cost model, the cost table and the HBM
 * cap read it. */
#include "device.h"

#define PRICES(od, flex, y1, y3) { od, flex, y1, y3 }

static const ctpu_chip_info profiles[] = {
    { "v5e", 128, 4, 1, 16ull << 30, 819.0, 197e12, PRICES(1.20, 0.60, 0.84, 0.54), "us-central1",
      "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s, "
      "1 TensorCore with 4 MXUs (128x128); cloud.google.com/tpu/pricing (checked 2026-10-25), us-central1: "
      "$1.20 on demand, $0.60 Flex-start, $0.84 1-year, $0.54 3-year per chip-hour" },
    { "v5p", 128, 4, 2, 95ull << 30, 2765.0, 459e12, PRICES(4.20, 2.10, 2.94, 1.89), "us-east5",
      "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, "
      "2 TensorCores with 4 MXUs each (128x128); cloud.google.com/tpu/pricing (checked 2026-10-25), us-east5: "
      "$4.20 on demand, $2.10 Flex-start, $2.94 1-year, $1.89 3-year per chip-hour" },
    { "v6e", 256, 2, 1, 32ull << 30, 1638.0, 918e12, PRICES(3.24, 1.35, 2.27, 1.46), "asia-northeast1",
      "cloud.google.com/tpu/docs/v6e (Trillium): 918 TFLOP/s bf16, 32 GiB HBM at 1,638 GB/s, "
      "1 TensorCore, 256x256 MXUs; cloud.google.com/tpu/pricing (checked 2026-10-25), asia-northeast1: "
      "$3.24 on demand, $1.35 Flex-start, $2.27 1-year, $1.46 3-year per chip-hour" },
    { "7x", 256, 2, 2, 192ull << 30, 7380.0, 2307e12, PRICES(12.00, 6.00, 8.40, 5.40), "us-central1",
      "cloud.google.com/tpu/docs/tpu7x (Ironwood): 2307 TFLOP/s bf16, 192 GiB HBM3e at "
      "7,380 GB/s, 2 TensorCores, 256x256 MXUs; cloud.google.com/tpu/pricing (checked 2026-10-25), us-central1: "
      "$12.00 on demand, $6.00 Flex-start, $8.40 1-year, $5.40 3-year per chip-hour" },
};

const ctpu_chip_info *ctpu_chip_profiles(int *count)
{
    *count = (int)(sizeof profiles / sizeof profiles[0]);
    return profiles;
}

const char *ctpu_price_plan_name(ctpu_price_plan p)
{
    static const char *const names[CTPU_PRICE_PLAN_COUNT] = { "on_demand", "flex_start", "1y", "3y" };
    return (unsigned)p < CTPU_PRICE_PLAN_COUNT ? names[p] : "?";
}
