/* build_info.c — what this build contains, for users and for tests that must skip. */
#include "specdec.h"

int sd_built_with_cuda(void) {
#ifdef SD_WITH_CUDA
    return 1;
#else
    return 0;
#endif
}
