/* dispatch.h — the one dispatch point of the CPU kernels (dispatch.c): which SIMD twins run on
 * this CPU. The dispatched entry points themselves (sd_quantize_q8, sd_attend, sd_swiglu,
 * sd_tile_repacked, ...) are declared with their portable twins in quant.h and ops_cpu.h. */
#ifndef SD_DISPATCH_H
#define SD_DISPATCH_H

/* Select SIMD kernels for this CPU (idempotent, thread-safe): model loading calls it, and every
 * dispatched entry point works before it (with the portable kernels) and after. */
void sd_kernels_init(void);

#endif /* SD_DISPATCH_H */
