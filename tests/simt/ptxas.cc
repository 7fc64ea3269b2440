// kvdrift: the SIMT simulator's hold on what a GPU refuses for a kernel's
// resources (see simt.h, usage_of). A launch whose block needs more
// registers than a block may have fails on a GPU with "too many resources
// requested for launch", and one whose static and dynamic shared memory add
// up past what the kernel may have fails too; the simulator runs kernels
// compiled for the host, so it learns their registers and static shared
// memory from ptxas, through the lines scripts/nvcc-usage.sh keeps from the
// CUDA build: "ARCH REGISTERS STATIC_SHARED STACK MANGLED_NAME".
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "simt.h"

namespace kvd_simt {
namespace {

// A block's register file (compute capability 9.0 and 12.0 alike): 64K
// registers, given out a warp at a time in units of 256.
const long block_regs = 65536, reg_unit = 256;

// One spelling for the anonymous namespace: the host compiler mangles it
// "12_GLOBAL__N_1", nvcc "<n>_GLOBAL__N__<hash>_<file>_<hash>"; each
// becomes "@". Every other part of the two manglings is the same.
std::string plain_name(const char *m) {
    std::string out;
    for (const char *p = m; *p;) {
        if (*p >= '1' && *p <= '9' && (p == m || p[-1] < '0' || p[-1] > '9')) {
            char *end;
            long n = std::strtol(p, &end, 10);
            if (!std::strncmp(end, "_GLOBAL__N", 10) && (long)std::strlen(end) >= n) {
                out += '@';
                p = end + n;
                continue;
            }
        }
        out += *p++;
    }
    return out;
}

// this executable's functions by address (from its ELF symbol table, which
// names local functions too, unlike the dynamic one)
struct symbols {
    std::unordered_map<uintptr_t, std::string> by_addr;
    bool read = false;
};
symbols &syms() {
    static symbols s;
    return s;
}

int first_object(struct dl_phdr_info *info, size_t, void *bias) {
    *static_cast<uintptr_t *>(bias) = (uintptr_t)info->dlpi_addr;
    return 1; // the first is the executable
}

void read_symbols() {
    symbols &s = syms();
    s.read = true;
    uintptr_t bias = 0;
    dl_iterate_phdr(first_object, &bias);
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) return;
    struct stat st;
    void *map = fstat(fd, &st) == 0 && (size_t)st.st_size > sizeof(Elf64_Ehdr)
                    ? mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return;
    const char *base = static_cast<const char *>(map);
    const size_t size = (size_t)st.st_size;
    const Elf64_Ehdr *eh = reinterpret_cast<const Elf64_Ehdr *>(base);
    if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > size) {
        munmap(map, size);
        return;
    }
    const Elf64_Shdr *sh = reinterpret_cast<const Elf64_Shdr *>(base + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Shdr &strs = sh[sh[i].sh_link];
        if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size)
            continue;
        const Elf64_Sym *sym = reinterpret_cast<const Elf64_Sym *>(base + sh[i].sh_offset);
        for (size_t j = 0; j < sh[i].sh_size / sizeof(Elf64_Sym); j++) {
            if (ELF64_ST_TYPE(sym[j].st_info) != STT_FUNC || !sym[j].st_value ||
                sym[j].st_name >= strs.sh_size)
                continue;
            const char *name = base + strs.sh_offset + sym[j].st_name;
            s.by_addr.emplace((uintptr_t)sym[j].st_value + bias,
                              std::string(name, strnlen(name, strs.sh_size - sym[j].st_name)));
        }
    }
    munmap(map, size);
}

struct table {
    std::string dir;                                             // where it came from
    std::unordered_map<std::string, kernel_usage> usage;         // "arch plain_name"
    std::unordered_map<const void *, const kernel_usage *> seen; // this device's, by kernel
    bool loaded = false, from_env = false;
    // the launches that fitted: their kernels, and the fullest register file
    std::unordered_set<const void *> fitted;
    long fullest = 0;
    std::string fullest_name;
    table() {
        const char *d = std::getenv("KVD_SIMT_PTXAS");
        from_env = d && *d;
        if (from_env) dir = d;
    }
    ~table() {
        if (loaded && !fitted.empty())
            std::fprintf(
                stderr,
                "kvd_simt: launches of %zu kernel%s held to ptxas's %s registers and shared "
                "memory; the fullest register file: %ld of %ld (%s)\n",
                fitted.size(), fitted.size() == 1 ? "" : "s", device().arch, fullest, block_regs,
                fullest_name.c_str());
    }
};
table &tab() {
    static table t;
    return t;
}

int load(table &t, const char *dir) {
    t.usage.clear();
    t.seen.clear();
    t.loaded = false;
    t.fitted.clear();
    t.fullest = 0;
    if (!dir) return 0;
    t.dir = dir;
    DIR *d = opendir(dir);
    if (!d) {
        std::fprintf(stderr, "kvd_simt: %s: cannot open ptxas's usage folder\n", dir);
        return -1;
    }
    int files = 0, rc = 0;
    while (struct dirent *e = readdir(d)) {
        const size_t n = std::strlen(e->d_name);
        if (n < 7 || std::strcmp(e->d_name + n - 6, ".usage")) continue;
        const std::string path = std::string(dir) + "/" + e->d_name;
        FILE *f = std::fopen(path.c_str(), "r");
        if (!f) continue;
        files++;
        char line[4096];
        for (int ln = 1; std::fgets(line, sizeof line, f); ln++) {
            char arch[32], name[4000];
            int regs;
            long smem, stack;
            if (std::sscanf(line, "%31s %d %ld %ld %3999s", arch, &regs, &smem, &stack, name) !=
                    5 ||
                regs < 0 || regs > 255 || smem < 0) {
                std::fprintf(stderr,
                             "kvd_simt: %s line %d: expected ARCH REGISTERS STATIC_SHARED STACK "
                             "NAME\n",
                             path.c_str(), ln);
                rc = -1;
                break;
            }
            t.usage[std::string(arch) + " " + plain_name(name)] = {regs, (size_t)smem};
        }
        std::fclose(f);
    }
    closedir(d);
    if (!files) {
        std::fprintf(stderr, "kvd_simt: %s: no .usage files (scripts/nvcc-usage.sh writes them)\n",
                     dir);
        rc = -1;
    }
    t.loaded = rc == 0;
    return rc;
}

table &loaded() {
    table &t = tab();
    if (t.from_env) {
        t.from_env = false;
        if (load(t, t.dir.c_str())) std::exit(2);
    }
    return t;
}

} // namespace

const char *symbol_of(const void *fn) {
    if (!syms().read) read_symbols();
    auto it = syms().by_addr.find((uintptr_t)fn);
    return it == syms().by_addr.end() ? nullptr : it->second.c_str();
}

bool usage_loaded() {
    return loaded().loaded;
}

int usage_load(const char *dir) {
    tab().from_env = false;
    return load(tab(), dir);
}

const kernel_usage *usage_of(const void *kernel) {
    table &t = loaded();
    if (!t.loaded) return nullptr;
    auto s = t.seen.find(kernel);
    if (s != t.seen.end()) return s->second;
    const char *name = symbol_of(kernel);
    const kernel_usage *u = nullptr;
    if (name) {
        auto it = t.usage.find(std::string(device().arch) + " " + plain_name(name));
        if (it != t.usage.end()) u = &it->second;
    }
    t.seen[kernel] = u;
    return u;
}

const char *refused_resources(const config &c, char *msg, size_t n, cudaError_t *code) {
    table &t = loaded();
    if (!t.loaded || !c.kernel) return nullptr;
    const kernel_usage *u = usage_of(c.kernel);
    if (!u) {
        const char *sym = symbol_of(c.kernel);
        std::snprintf(msg, n,
                      "ptxas's table (%s) has no %s entry for %s: the table is older than the "
                      "kernel, or the simulator and nvcc name it differently",
                      t.dir.c_str(), device().arch, sym ? sym : "(no symbol)");
        *code = cudaErrorInvalidConfiguration;
        return msg;
    }
    const long threads = (long)c.block.x * c.block.y * c.block.z, warps = (threads + 31) / 32;
    const long per_warp = (u->regs * 32L + reg_unit - 1) / reg_unit * reg_unit;
    if (warps * per_warp > block_regs) {
        std::snprintf(msg, n,
                      "too many resources: %ld warps of %d registers a thread take %ld registers, "
                      "a block has %ld (ptxas, %s)",
                      warps, u->regs, warps * per_warp, block_regs, device().arch);
        *code = cudaErrorLaunchOutOfResources;
        return msg;
    }
    // dynamic shared memory: what the opt-in allows, else 48 KB less the static
    const size_t dyn_max =
        c.shmem_optin ? c.shmem_optin : (u->smem < 48 * 1024 ? 48 * 1024 - u->smem : 0);
    if (c.shmem > dyn_max) {
        std::snprintf(msg, n,
                      "%zu bytes of dynamic shared memory, the kernel may have %zu beside its %zu "
                      "static (ptxas, %s)",
                      c.shmem, dyn_max, u->smem, device().arch);
        *code = cudaErrorInvalidValue;
        return msg;
    }
    t.fitted.insert(c.kernel);
    if (warps * per_warp > t.fullest) {
        t.fullest = warps * per_warp;
        t.fullest_name = c.name;
    }
    return nullptr;
}

} // namespace kvd_simt
