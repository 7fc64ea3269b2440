// kvdrift: cublasLt.h for the SIMT simulator (tests/simt/simt.h)
#include "../simt.h"
