// Compiles one CUDA C++ file with NVRTC (the pinned libnvrtc) to PTX, as symcomm's host does at run
// time: no standard headers, `-std=c++17`, include directories from the command line. Used by
// device/tests/numerics.rs, built with the system C++ compiler against the pinned nvrtc.h.
//
//   nvrtc_compile <source.cu> <arch, e.g. compute_80> <out.ptx> [-I<dir>]...
//
// Prints the NVRTC log; exits 0 only when the compile succeeded and the PTX was written.
#include <nvrtc.h>
#include <stdio.h>

#include <string>
#include <vector>

static bool check(nvrtcResult r, const char* what) {
    if (r == NVRTC_SUCCESS) return true;
    fprintf(stderr, "%s: %s\n", what, nvrtcGetErrorString(r));
    return false;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s <source.cu> <arch> <out.ptx> [-I<dir>]...\n", argv[0]);
        return 2;
    }
    FILE* f = fopen(argv[1], "rb");
    if (f == nullptr) {
        perror(argv[1]);
        return 2;
    }
    std::string src;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) src.append(buf, n);
    fclose(f);

    int major = 0, minor = 0;
    if (!check(nvrtcVersion(&major, &minor), "nvrtcVersion")) return 1;
    printf("NVRTC %d.%d, %s for %s\n", major, minor, argv[1], argv[2]);

    nvrtcProgram prog;
    if (!check(nvrtcCreateProgram(&prog, src.c_str(), argv[1], 0, nullptr, nullptr), "nvrtcCreateProgram")) return 1;
    std::vector<std::string> opts = {std::string("--gpu-architecture=") + argv[2], "-std=c++17"};
    for (int i = 4; i < argc; ++i) opts.push_back(argv[i]);
    std::vector<const char*> optp;
    for (const std::string& o : opts) optp.push_back(o.c_str());
    const nvrtcResult res = nvrtcCompileProgram(prog, int(optp.size()), optp.data());
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) nvrtcGetProgramLog(prog, &log[0]);
    if (log_size > 1) printf("%s\n", log.c_str());
    if (!check(res, "nvrtcCompileProgram")) return 1;

    size_t ptx_size = 0;
    if (!check(nvrtcGetPTXSize(prog, &ptx_size), "nvrtcGetPTXSize")) return 1;
    std::string ptx(ptx_size, '\0');
    if (!check(nvrtcGetPTX(prog, &ptx[0]), "nvrtcGetPTX")) return 1;
    nvrtcDestroyProgram(&prog);
    FILE* out = fopen(argv[3], "wb");
    if (out == nullptr || fwrite(ptx.data(), 1, ptx.size() - 1, out) != ptx.size() - 1 || fclose(out) != 0) {
        perror(argv[3]);
        return 1;
    }
    printf("wrote %zu bytes of PTX\n", ptx.size() - 1);
    return 0;
}
