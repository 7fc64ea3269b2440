// kvdrift: cuda_fp8.h for the SIMT simulator (tests/simt/simt.h)
#include "../simt.h"
