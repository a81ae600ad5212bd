// Hostile neighbours of the churn harness's --hostile mode (decision 0013),
// and its root bystander. One program, one mode per argument:
//
//   hostile bystander           root: spins in by_outer -> by_burn for ever
//   hostile fifo                /tmp/perf-PID.map is a FIFO with no writer
//   hostile jit-huge DIR        DIR/jit-PID.dump (mapped executable) is a
//                               1 GiB sparse file whose first record claims
//                               0xfffffff0 bytes
//   hostile jit-grow DIR MIB    DIR/jit-PID.dump grows by valid code-load
//                               records at about 10 MB/s; at MIB MiB the
//                               file is removed and the program exits (its
//                               caller starts another)
//   hostile map-name            a perf map line whose name is 100 MB
//   hostile map-lines           a perf map of 256 MiB of tiny lines
//   hostile map-symlink TARGET  /tmp/perf-PID.map is a symlink to TARGET;
//                               the code runs at SYMLINK_PAGE, which TARGET
//                               names
//
// Every mode but the bystander runs its code in an anonymous executable
// page (as a JIT does), about 2 ms of every 40 ms, so the profiler samples
// it and looks for its JIT symbol files, without taking a whole CPU.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NI __attribute__((noinline))

// The bystander: a known call chain (main;by_outer;by_burn).
volatile unsigned long sink;
NI void by_burn(void) {
    for (int i = 0; i < 100000; i++) sink += i;
}
NI void by_outer(void) {
    by_burn();
    sink++;
}

// Where map-symlink's code runs (the harness's root-only file names it).
#define SYMLINK_PAGE 0x10000000UL
// Bytes of code a jit-grow code-load record carries, and of the region.
#define JIT_CODE 1024
#define JIT_REGION (1UL << 20)

static void die(const char *what) {
    perror(what);
    exit(2);
}

// An anonymous RWX region of `size` bytes (at `at` when not 0) whose first
// bytes are `mov ecx, 4000000; 1: dec ecx; jnz 1b; ret`.
static void (*code_region(unsigned long at, size_t size))(void) {
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0);
    unsigned char *p = mmap((void *)at, size, PROT_READ | PROT_WRITE | PROT_EXEC, flags, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    static const unsigned char code[] = {0xb9, 0x00, 0x09, 0x3d, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};
    memcpy(p, code, sizeof code);
    return (void (*)(void))p;
}

static void pause_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

// Run `fn` about 2 ms of every 40 ms, for ever.
static void spin(void (*fn)(void)) {
    for (;;) {
        fn();
        pause_ms(38);
    }
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + t.tv_nsec;
}

static void perf_map_path(char *path, size_t n) {
    snprintf(path, n, "/tmp/perf-%d.map", getpid());
}

// Create DIR/jit-PID.dump with a file header, and map it executable (the
// marker by which profilers find it). Returns its descriptor.
static int jitdump(const char *dir, char *path, size_t n) {
    snprintf(path, n, "%s/jit-%d.dump", dir, getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die(path);
    uint32_t h[6] = {0x4A695444, 1, 40, 62, 0, (uint32_t)getpid()};
    uint64_t tail[2] = {now_ns(), 0};
    if (write(fd, h, sizeof h) != sizeof h || write(fd, tail, sizeof tail) != sizeof tail) die("write");
    if (mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) die("mmap jitdump");
    return fd;
}

static int jit_huge(const char *dir) {
    char path[4096];
    int fd = jitdump(dir, path, sizeof path);
    uint32_t rec[4] = {0, 0xfffffff0u, 7, 0};
    if (write(fd, rec, sizeof rec) != sizeof rec || ftruncate(fd, 1L << 30) != 0) die("jit-huge");
    close(fd);
    spin(code_region(0, 4096));
    return 0;
}

// One JIT_CODE_LOAD record of JIT_CODE bytes at `addr` named jit_grow_I.
static size_t code_load(unsigned char *buf, uint64_t addr, unsigned long i) {
    char name[32];
    int len = snprintf(name, sizeof name, "jit_grow_%lu", i) + 1;
    uint32_t size = 16 + 40 + len + JIT_CODE;
    uint32_t head[2] = {0, size};
    uint64_t ts = now_ns();
    uint32_t ids[2] = {(uint32_t)getpid(), (uint32_t)getpid()};
    uint64_t body[4] = {addr, addr, JIT_CODE, i};
    unsigned char *p = buf;
    memcpy(p, head, 8), p += 8;
    memcpy(p, &ts, 8), p += 8;
    memcpy(p, ids, 8), p += 8;
    memcpy(p, body, 32), p += 32;
    memcpy(p, name, len), p += len;
    memcpy(p, (void *)addr, JIT_CODE);
    return size;
}

static int jit_grow(const char *dir, long cap_mib) {
    char path[4096];
    int fd = jitdump(dir, path, sizeof path);
    void (*fn)(void) = code_region(0, JIT_REGION);
    static unsigned char buf[1 << 20];
    unsigned long i = 0;
    long written = 0;
    while (written < cap_mib << 20) {
        // 400 KB every 40 ms: about 10 MB/s.
        size_t n = 0;
        while (n < 400000) n += code_load(buf + n, (uint64_t)fn + (i % (JIT_REGION / JIT_CODE)) * JIT_CODE, i), i++;
        if (write(fd, buf, n) != (ssize_t)n) die("write");
        written += n;
        fn();
        pause_ms(38);
    }
    unlink(path);
    return 0;
}

static int map_name(void) {
    void (*fn)(void) = code_region(0, 4096);
    char path[64];
    perf_map_path(path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) die(path);
    fprintf(f, "%lx 1000 ", (unsigned long)fn);
    static char chunk[1 << 20];
    memset(chunk, 'A', sizeof chunk);
    for (long left = 100000000; left > 0; left -= sizeof chunk)
        fwrite(chunk, 1, left < (long)sizeof chunk ? left : (long)sizeof chunk, f);
    fputc('\n', f);
    fclose(f);
    spin(fn);
    return 0;
}

static int map_lines(void) {
    void (*fn)(void) = code_region(0, 4096);
    char path[64];
    perf_map_path(path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) die(path);
    unsigned long base = (unsigned long)fn;
    for (long bytes = 0, i = 0; bytes < 256L << 20; i++)
        bytes += fprintf(f, "%lx 1 f%lx\n", base + (i & 4095), i);
    fclose(f);
    spin(fn);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    char path[64];
    if (!strcmp(mode, "bystander")) {
        for (;;) by_outer();
    } else if (!strcmp(mode, "fifo")) {
        perf_map_path(path, sizeof path);
        if (mkfifo(path, 0644) != 0) die(path);
        spin(code_region(0, 4096));
    } else if (!strcmp(mode, "jit-huge") && argc > 2) {
        return jit_huge(argv[2]);
    } else if (!strcmp(mode, "jit-grow") && argc > 3) {
        return jit_grow(argv[2], atol(argv[3]));
    } else if (!strcmp(mode, "map-name")) {
        return map_name();
    } else if (!strcmp(mode, "map-lines")) {
        return map_lines();
    } else if (!strcmp(mode, "map-symlink") && argc > 2) {
        void (*fn)(void) = code_region(SYMLINK_PAGE, 4096);
        perf_map_path(path, sizeof path);
        if (symlink(argv[2], path) != 0) die(path);
        spin(fn);
    }
    fprintf(stderr, "usage: hostile bystander|fifo|jit-huge DIR|jit-grow DIR MIB|map-name|map-lines|map-symlink TARGET\n");
    return 2;
}
