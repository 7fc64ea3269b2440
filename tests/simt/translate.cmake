# kvdrift: a .cu file as C++ for the SIMT simulator (simt.h): each launch
# `k<<<cfg>>>(args)` becomes `k % kvd_simt::launch("k", cfg)(args)`, and
# `extern __shared__ T name[];` a pointer to the block's dynamic shared memory.
# usage: cmake -DIN=file.cu -DOUT=file.cc -P translate.cmake
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*)(<[^<>{}]*>|)<<<([^>]*)>>>"
       "\\1\\2 % kvd_simt::launch(\"\\1\", \\3)" src "${src}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_][A-Za-z0-9_]*) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\1 *\\2 = static_cast<\\1 *>(kvd_simt::dynamic_shared());" src "${src}")
if(src MATCHES "<<<|>>>|extern __shared__")
  message(FATAL_ERROR "${IN}: a launch or shared declaration the SIMT translation does not know")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
