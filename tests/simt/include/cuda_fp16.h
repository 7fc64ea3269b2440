// kvdrift: cuda_fp16.h for the SIMT simulator (tests/simt/simt.h)
#include "../simt.h"
