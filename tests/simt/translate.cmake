# kvdrift: a .cu file as C++ for the SIMT simulator (simt.h): each launch
# `k<<<cfg>>>(args)` becomes `k % kvd_simt::launch("k", cfg)(args)`, and
# `extern __shared__ T name[];` a pointer to the block's dynamic shared memory,
# `__shared__ T name...;` a static the block's first thread fills with 0xff,
# and a kernel's `__launch_bounds__(MAX, ...)` a check of its block size.
# usage: cmake -DIN=file.cu -DOUT=file.cc -P translate.cmake
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*)(<[^<>{}]*>|)<<<([^>]*)>>>"
       "\\1\\2 % kvd_simt::launch(\"\\1\", \\3)" src "${src}")
# a kernel's __launch_bounds__(MAX[, MIN]) becomes a check of its block size
# at the start of its body (the simulator has no other hold on the bound)
string(REGEX REPLACE "__launch_bounds__\\(([^,(){}]*(\\([^(){}]*\\))?[^,(){}]*)(,[^(){}]*)?\\)([^{]*)\\{"
       "\\4{ kvd_simt::launch_bound(\\1);" src "${src}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_][A-Za-z0-9_]*) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\1 *\\2 = static_cast<\\1 *>(kvd_simt::dynamic_shared());" src "${src}")
# a __shared__ variable (one a declaration) is a static here, which would
# keep what the last block wrote: the first of a block's threads to reach
# its declaration fills it with 0xff bytes, as a block's dynamic shared
# memory is filled, so a read of what this block never wrote shows
string(REGEX REPLACE "__shared__ ([A-Za-z_][A-Za-z0-9_:]*) ([A-Za-z_][A-Za-z0-9_]*)([^;,=(){}]*);"
       "static \\1 \\2\\3; kvd_simt::shared_fresh(&\\2, sizeof \\2);" src "${src}")
if(src MATCHES "<<<|>>>|__shared__|__launch_bounds__")
  message(FATAL_ERROR "${IN}: a launch, shared declaration (one variable a declaration) or launch bound the SIMT translation does not know")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
