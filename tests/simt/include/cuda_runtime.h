// kvdrift: cuda_runtime.h for the SIMT simulator (tests/simt/simt.h)
#include "../simt.h"
