/*
 * libnvidia-ml.so.1 for sandbox hosts: NVML backed by the simulated GPUs.
 *
 * The sandbox's GPUs are simulated by sandbox/gpusim.py; this library reads
 * the very same state as the `nvidia-smi` stand-in, so the REAL NVML bindings
 * (nvidia-ml-py's pynvml, NCCL, ...) see what nvidia-smi prints:
 *
 *   layout    $SANDBOX_GPU_LAYOUT   (default /etc/sandbox-gpu/layout.json)
 *             read at nvmlInit*: GPUs, driver/CUDA version, P2P matrix,
 *             fields marked unavailable ("[N/A]" / "[Not Supported]").
 *   registry  $SANDBOX_GPU_REGISTRY (default /run/sandbox-gpu/<pid>.json)
 *             read at every memory/process query: one file per process
 *             holding simulated GPU memory; counted only while that PID lives
 *             with the same /proc/<pid>/stat starttime (gpusim's rule).
 *
 * Both files are JSON, parsed here by a small strict parser (no dependency).
 * Unknown NVML functions are simply absent: pynvml then raises
 * NVMLError_FunctionNotFound, like with an older real driver.
 *
 * Build: sandbox/nvml/build.py (gcc -shared -fPIC, soname libnvidia-ml.so.1).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------ NVML types */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999,
};

enum { /* nvmlGpuP2PStatus_t */
    NVML_P2P_STATUS_OK = 0,
    NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1,
    NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2,
    NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3,
    NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4,
    NVML_P2P_STATUS_NOT_SUPPORTED = 5,
    NVML_P2P_STATUS_UNKNOWN = 6,
};
/* nvmlGpuP2PCapsIndex_t -> the letter of `nvidia-smi topo -p2p <letter>` */
static const char P2P_CAPS[] = "rwnap"; /* READ WRITE NVLINK ATOMICS PROP(=PCI) */

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFU
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version;
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int baseClass;
    unsigned int subClass;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfoExt_t;
#define nvmlPciInfoExt_v1 NVML_STRUCT_VERSION(sizeof(nvmlPciInfoExt_t), 1)

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)

typedef struct { /* nvmlProcessInfo_v1_t: the unversioned entry point */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (_v2 and _v3 entry points) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* ---------------------------------------------------------- minimal JSON */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    int type;
    double num;
    char *str;        /* J_STR */
    int n, cap;       /* J_ARR / J_OBJ */
    char **keys;      /* J_OBJ */
    struct jv **vals; /* J_ARR / J_OBJ */
} jv;

typedef struct {
    const char *s, *end;
    int depth;
} jparser;

static void jfree(jv *v) {
    if (!v) return;
    for (int i = 0; i < v->n; i++) {
        if (v->keys) free(v->keys[i]);
        jfree(v->vals[i]);
    }
    free(v->keys);
    free(v->vals);
    free(v->str);
    free(v);
}

static void jskip_ws(jparser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static int jhex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static int jput_utf8(char *out, unsigned cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* parses a string literal at p->s (the opening quote); returns a malloc'd UTF-8 string */
static char *jparse_string(jparser *p) {
    if (p->s >= p->end || *p->s != '"') return NULL;
    p->s++;
    /* the decoded string is never longer than the literal */
    const char *q = p->s;
    while (q < p->end && *q != '"') q += (*q == '\\' && q + 1 < p->end) ? 2 : 1;
    if (q >= p->end) return NULL;
    char *out = malloc((size_t)(q - p->s) + 1);
    if (!out) return NULL;
    size_t n = 0;
    while (p->s < p->end && *p->s != '"') {
        unsigned char c = (unsigned char)*p->s;
        if (c < 0x20) goto fail;
        if (c != '\\') { out[n++] = (char)c; p->s++; continue; }
        if (p->s + 1 >= p->end) goto fail;
        char e = p->s[1];
        p->s += 2;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (p->end - p->s < 4 || jhex4(p->s, &cp)) goto fail;
            p->s += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* surrogate pair: 12 bytes -> 4 */
                if (p->end - p->s < 6 || p->s[0] != '\\' || p->s[1] != 'u' || jhex4(p->s + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    goto fail;
                p->s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto fail;
            }
            n += (size_t)jput_utf8(out + n, cp);
            break;
        }
        default: goto fail;
        }
    }
    if (p->s >= p->end) goto fail;
    p->s++; /* closing quote */
    out[n] = '\0';
    return out;
fail:
    free(out);
    return NULL;
}

static jv *jnew(int type) {
    jv *v = calloc(1, sizeof(jv));
    if (v) v->type = type;
    return v;
}

static int jappend(jv *v, char *key, jv *item) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        jv **vals = realloc(v->vals, sizeof(jv *) * (size_t)cap);
        if (!vals) return -1;
        v->vals = vals;
        if (v->type == J_OBJ) {
            char **keys = realloc(v->keys, sizeof(char *) * (size_t)cap);
            if (!keys) return -1;
            v->keys = keys;
        }
        v->cap = cap;
    }
    if (v->type == J_OBJ) v->keys[v->n] = key;
    v->vals[v->n++] = item;
    return 0;
}

static jv *jparse_value(jparser *p);

static jv *jparse_container(jparser *p, int type) {
    char close = type == J_OBJ ? '}' : ']';
    jv *v = jnew(type);
    if (!v) return NULL;
    p->s++; /* '{' or '[' */
    jskip_ws(p);
    if (p->s < p->end && *p->s == close) { p->s++; return v; }
    for (;;) {
        char *key = NULL;
        jskip_ws(p);
        if (type == J_OBJ) {
            key = jparse_string(p);
            if (!key) goto fail;
            jskip_ws(p);
            if (p->s >= p->end || *p->s != ':') { free(key); goto fail; }
            p->s++;
        }
        jv *item = jparse_value(p);
        if (!item || jappend(v, key, item)) { free(key); jfree(item); goto fail; }
        jskip_ws(p);
        if (p->s < p->end && *p->s == ',') { p->s++; continue; }
        if (p->s < p->end && *p->s == close) { p->s++; return v; }
        goto fail;
    }
fail:
    jfree(v);
    return NULL;
}

static jv *jparse_value(jparser *p) {
    jskip_ws(p);
    if (p->s >= p->end || ++p->depth > 64) return NULL;
    jv *v = NULL;
    char c = *p->s;
    if (c == '{') v = jparse_container(p, J_OBJ);
    else if (c == '[') v = jparse_container(p, J_ARR);
    else if (c == '"') {
        char *s = jparse_string(p);
        if (s && (v = jnew(J_STR))) v->str = s;
        else free(s);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t n = 0;
        while (p->s + n < p->end && n < sizeof(buf) - 1 && strchr("+-0123456789.eE", p->s[n])) n++;
        memcpy(buf, p->s, n);
        buf[n] = '\0';
        char *endp;
        double d = strtod(buf, &endp);
        if (endp == buf + n && n > 0 && (v = jnew(J_NUM))) { v->num = d; p->s += n; }
    } else if (p->end - p->s >= 4 && !strncmp(p->s, "true", 4)) {
        if ((v = jnew(J_BOOL))) { v->num = 1; p->s += 4; }
    } else if (p->end - p->s >= 5 && !strncmp(p->s, "false", 5)) {
        if ((v = jnew(J_BOOL))) { v->num = 0; p->s += 5; }
    } else if (p->end - p->s >= 4 && !strncmp(p->s, "null", 4)) {
        if ((v = jnew(J_NULL))) p->s += 4;
    }
    p->depth--;
    return v;
}

static jv *jparse(const char *text, size_t len) {
    jparser p = {text, text + len, 0};
    jv *v = jparse_value(&p);
    jskip_ws(&p);
    if (v && p.s != p.end) { jfree(v); return NULL; }
    return v;
}

static jv *jget(const jv *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = obj->n - 1; i >= 0; i--) /* last duplicate wins, like Python's json */
        if (!strcmp(obj->keys[i], key)) return obj->vals[i];
    return NULL;
}

static const char *jstr(const jv *v, const char *dflt) { return v && v->type == J_STR ? v->str : dflt; }

static int jnum(const jv *v, double *out) {
    if (!v || v->type != J_NUM) return 0;
    *out = v->num;
    return 1;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= (64u << 20)) { free(buf); buf = NULL; break; }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (buf && ferror(f)) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) *len = n;
    return buf;
}

static jv *jparse_file(const char *path) {
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) return NULL;
    jv *v = jparse(text, len);
    free(text);
    return v;
}

/* ------------------------------------------------------ simulated state */

#define MAX_GPUS 64
#define MIB 1048576ULL

/* fields of the layout's per-GPU "unavailable" / "apps_unavailable" maps
 * (nvidia-smi's canonical field names) that make an NVML query fail */
enum {
    UNAV_NAME = 1 << 0,
    UNAV_UUID = 1 << 1,
    UNAV_PCI = 1 << 2,
    UNAV_CC = 1 << 3,
    UNAV_MEMORY = 1 << 4,
    UNAV_APP_MEMORY = 1 << 5,
};

struct nvmlDevice_st {
    unsigned int index;       /* gpu["index"] */
    char name[96];
    char uuid[96];
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned int domain, bus, dev;
    int cc_major, cc_minor;
    unsigned long long total_mib;
    unsigned int unavailable; /* UNAV_* */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;
static struct nvmlDevice_st g_dev[MAX_GPUS];
static unsigned int g_ndev;
static char g_driver[80];
static int g_cuda_version; /* 13000 for "13.0" */
static unsigned char g_p2p[5][MAX_GPUS][MAX_GPUS]; /* [cap][i][j] -> nvmlGpuP2PStatus_t */
static char g_registry[4096];

static const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src ? src : "");
}

/* nvidia-smi topo -p2p's code -> nvmlGpuP2PStatus_t */
static int p2p_code(const char *code) {
    if (!code) return NVML_P2P_STATUS_UNKNOWN;
    if (!strcmp(code, "OK") || !strcmp(code, "X")) return NVML_P2P_STATUS_OK;
    if (!strcmp(code, "CNS")) return NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED;
    if (!strcmp(code, "GNS")) return NVML_P2P_STATUS_GPU_NOT_SUPPORTED;
    if (!strcmp(code, "TNS")) return NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED;
    if (!strcmp(code, "DR")) return NVML_P2P_STATUS_DISABLED_BY_REGKEY;
    if (!strcmp(code, "NS")) return NVML_P2P_STATUS_NOT_SUPPORTED;
    return NVML_P2P_STATUS_UNKNOWN;
}

static unsigned int unavailable_bits(const jv *map, int apps) {
    unsigned int bits = 0;
    if (!map || map->type != J_OBJ) return 0;
    for (int i = 0; i < map->n; i++) {
        const char *k = map->keys[i];
        if (map->vals[i]->type == J_NULL) continue;
        if (apps) {
            if (!strcmp(k, "used_gpu_memory") || !strcmp(k, "used_memory")) bits |= UNAV_APP_MEMORY;
        } else if (!strcmp(k, "name")) bits |= UNAV_NAME;
        else if (!strcmp(k, "uuid")) bits |= UNAV_UUID;
        else if (!strncmp(k, "pci.", 4)) bits |= UNAV_PCI;
        else if (!strcmp(k, "compute_cap")) bits |= UNAV_CC;
        else if (!strcmp(k, "memory.total") || !strcmp(k, "memory.used") || !strcmp(k, "memory.free") ||
                 !strcmp(k, "memory.reserved"))
            bits |= UNAV_MEMORY;
    }
    return bits;
}

/* reads the layout into the g_* tables; NVML_SUCCESS or an NVML error */
static nvmlReturn_t load_layout(void) {
    jv *layout = jparse_file(env_or("SANDBOX_GPU_LAYOUT", "/etc/sandbox-gpu/layout.json"));
    if (!layout || layout->type != J_OBJ) {
        jfree(layout);
        return NVML_ERROR_DRIVER_NOT_LOADED; /* nvidia-smi: "couldn't communicate with the NVIDIA driver" */
    }
    copy_str(g_registry, sizeof(g_registry), env_or("SANDBOX_GPU_REGISTRY", "/run/sandbox-gpu"));
    copy_str(g_driver, sizeof(g_driver), jstr(jget(layout, "driver_version"), ""));
    int major = 0, minor = 0;
    sscanf(jstr(jget(layout, "cuda_version"), "0.0"), "%d.%d", &major, &minor);
    g_cuda_version = major * 1000 + minor * 10;

    const jv *gpus = jget(layout, "gpus");
    g_ndev = 0;
    memset(g_dev, 0, sizeof(g_dev));
    for (int i = 0; gpus && gpus->type == J_ARR && i < gpus->n && g_ndev < MAX_GPUS; i++) {
        const jv *g = gpus->vals[i];
        struct nvmlDevice_st *d = &g_dev[g_ndev];
        double num;
        if (!g || g->type != J_OBJ) continue;
        d->index = jnum(jget(g, "index"), &num) ? (unsigned int)num : g_ndev;
        copy_str(d->name, sizeof(d->name), jstr(jget(g, "name"), ""));
        copy_str(d->uuid, sizeof(d->uuid), jstr(jget(g, "uuid"), ""));
        copy_str(d->bus_id, sizeof(d->bus_id), jstr(jget(g, "pci_bus_id"), ""));
        sscanf(d->bus_id, "%x:%x:%x", &d->domain, &d->bus, &d->dev);
        sscanf(jstr(jget(g, "compute_cap"), "0.0"), "%d.%d", &d->cc_major, &d->cc_minor);
        d->total_mib = jnum(jget(g, "memory_total_mib"), &num) && num > 0 ? (unsigned long long)num : 0;
        d->unavailable = unavailable_bits(jget(g, "unavailable"), 0) | unavailable_bits(jget(g, "apps_unavailable"), 1);
        g_ndev++;
    }

    /* P2P: layout["p2p_matrix"][cap letter] rows/columns in layout order, else
     * layout["p2p"] for every pair (NVLink: "NS"), like `nvidia-smi topo -p2p` */
    const char *all = jstr(jget(layout, "p2p"), "OK");
    const jv *matrices = jget(layout, "p2p_matrix");
    for (int c = 0; c < 5; c++) {
        char cap[2] = {P2P_CAPS[c], 0};
        const jv *m = jget(matrices, cap);
        for (unsigned int i = 0; i < g_ndev; i++) {
            const jv *row = m && m->type == J_ARR && (int)i < m->n ? m->vals[i] : NULL;
            for (unsigned int j = 0; j < g_ndev; j++) {
                const char *code = P2P_CAPS[c] == 'n' ? "NS" : all;
                if (row && row->type == J_ARR && (int)j < row->n) code = jstr(row->vals[j], "U");
                g_p2p[c][i][j] = (unsigned char)(i == j ? NVML_P2P_STATUS_OK : p2p_code(code));
            }
        }
    }
    jfree(layout);
    return NVML_SUCCESS;
}

/* field 22 of /proc/<pid>/stat (starttime), as gpusim reads it; 0 when gone */
static int proc_starttime(unsigned int pid, char *out, size_t size) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    size_t len = 0;
    char *stat = read_file(path, &len);
    if (!stat) return 0;
    char *buf = realloc(stat, len + 1);
    if (!buf) { free(stat); return 0; }
    buf[len] = '\0';
    char *p = strrchr(buf, ')');
    int ok = 0;
    if (p) {
        char *save = NULL, *tok = strtok_r(p + 1, " \n", &save);
        for (int i = 0; tok && i < 19; i++) tok = strtok_r(NULL, " \n", &save);
        if (tok) { copy_str(out, size, tok); ok = 1; }
    }
    free(buf);
    return ok;
}

/* a registration counts while its PID lives with the same starttime (else: dead, or PID reused) */
static int entry_live(const jv *entry, double *pid) {
    char now[32];
    const jv *started = jget(entry, "starttime");
    return jnum(jget(entry, "pid"), pid) && *pid > 0 && started && started->type == J_STR &&
           proc_starttime((unsigned int)*pid, now, sizeof(now)) && !strcmp(now, started->str);
}

typedef struct {
    unsigned int pid;
    unsigned long long mib;
} holding_t;

static int cmp_holding(const void *a, const void *b) {
    unsigned int x = ((const holding_t *)a)->pid, y = ((const holding_t *)b)->pid;
    return x < y ? -1 : x > y;
}

/* live holdings on GPU `index` (sorted by pid); returns the count, *out malloc'd */
static int holdings_for(unsigned int index, holding_t **out) {
    *out = NULL;
    DIR *dir = opendir(g_registry);
    if (!dir) return 0;
    int n = 0, cap = 0;
    holding_t *list = NULL;
    char key[16];
    snprintf(key, sizeof(key), "%u", index);
    struct dirent *de;
    while ((de = readdir(dir))) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".json")) continue;
        char path[8192];
        snprintf(path, sizeof(path), "%s/%s", g_registry, de->d_name);
        jv *entry = jparse_file(path);
        double pid, mib;
        const jv *held = jget(jget(entry, "gpus"), key);
        if (entry_live(entry, &pid) && held && jnum(held, &mib)) {
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                holding_t *nl = realloc(list, sizeof(holding_t) * (size_t)cap);
                if (!nl) { jfree(entry); break; }
                list = nl;
            }
            list[n].pid = (unsigned int)pid;
            list[n].mib = mib > 0 ? (unsigned long long)mib : 0;
            n++;
        }
        jfree(entry);
    }
    closedir(dir);
    if (n > 1) qsort(list, (size_t)n, sizeof(holding_t), cmp_holding);
    *out = list;
    return n;
}

static unsigned long long used_mib(unsigned int index) {
    holding_t *list;
    int n = holdings_for(index, &list);
    unsigned long long sum = 0;
    for (int i = 0; i < n; i++) sum += list[i].mib;
    free(list);
    return sum;
}

/* ------------------------------------------------------------ helpers */

static nvmlReturn_t check_init(void) { return g_refcount > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED; }

static nvmlReturn_t check_device(nvmlDevice_t d) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!d || d < g_dev || d >= g_dev + g_ndev) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_string(char *buf, unsigned int length, const char *value) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ NVML API */

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, becasue ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags; /* NO_GPUS / NO_ATTACH: nothing to attach to here */
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) r = load_layout();
    if (r == NVML_SUCCESS) g_refcount++;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) r = NVML_ERROR_UNINITIALIZED;
    else g_refcount--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = check_init();
    return r ? r : put_string(version, length, g_driver);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    char buf[96]; /* e.g. 13.580.95.05: CUDA major + driver version */
    snprintf(buf, sizeof(buf), "%d.%s", g_cuda_version / 1000, g_driver);
    return put_string(version, length, buf);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = g_cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* the name nvidia-smi shows as process_name: the registration's */
EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!name || length == 0) return NVML_ERROR_INVALID_ARGUMENT;
    char path[8192];
    snprintf(path, sizeof(path), "%s/%u.json", g_registry, pid);
    jv *entry = jparse_file(path);
    double live_pid;
    if (entry_live(entry, &live_pid) && (unsigned int)live_pid == pid) {
        snprintf(name, length, "%s", jstr(jget(entry, "name"), "?")); /* truncated like the real one */
        r = NVML_SUCCESS;
    } else {
        r = NVML_ERROR_NOT_FOUND;
    }
    jfree(entry);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!deviceCount) return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = g_ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!device || index >= g_ndev) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_dev[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_ndev; i++)
        if (!strcmp(g_dev[i].uuid, uuid)) { *device = &g_dev[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    nvmlReturn_t r = check_init();
    if (r) return r;
    if (!pciBusId || !device) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int domain = 0, bus = 0, dev = 0;
    int n = sscanf(pciBusId, "%x:%x:%x", &domain, &bus, &dev);
    if (n == 2) { dev = bus; bus = domain; domain = 0; } /* "bus:device.function" */
    else if (n != 3) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < g_ndev; i++)
        if (g_dev[i].domain == domain && g_dev[i].bus == bus && g_dev[i].dev == dev) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (device->unavailable & UNAV_NAME) return NVML_ERROR_NOT_SUPPORTED;
    return put_string(name, length, device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (device->unavailable & UNAV_UUID) return NVML_ERROR_NOT_SUPPORTED;
    return put_string(uuid, length, device->uuid);
}

static void fill_pci(const struct nvmlDevice_st *d, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", d->domain & 0xFFFF, d->bus, d->dev);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", d->domain, d->bus, d->dev);
    pci->domain = d->domain;
    pci->bus = d->bus;
    pci->device = d->dev;
    pci->pciDeviceId = 0x2BB510DE;    /* nvidia-smi stand-in's pci.device_id */
    pci->pciSubSystemId = 0x204E10DE;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->unavailable & UNAV_PCI) return NVML_ERROR_NOT_SUPPORTED;
    fill_pci(device, pci);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (device->unavailable & UNAV_PCI) return NVML_ERROR_NOT_SUPPORTED;
    nvmlPciInfo_t v3;
    fill_pci(device, &v3);
    pci->domain = v3.domain;
    pci->bus = v3.bus;
    pci->device = v3.device;
    pci->pciDeviceId = v3.pciDeviceId;
    pci->pciSubSystemId = v3.pciSubSystemId;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller */
    memcpy(pci->busId, v3.busId, sizeof(pci->busId));
    return NVML_SUCCESS;
}

static nvmlReturn_t memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *used) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (device->unavailable & UNAV_MEMORY) return NVML_ERROR_NOT_SUPPORTED; /* unified memory */
    *total = device->total_mib * MIB;
    *used = used_mib(device->index) * MIB;
    if (*used > *total) *used = *total;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    unsigned long long total, used;
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if ((r = memory(device, &total, &used))) return r;
    mem->total = total;
    mem->used = used;
    mem->free = total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    unsigned long long total, used;
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((r = memory(device, &total, &used))) return r;
    mem->total = total;
    mem->reserved = 0; /* nvidia-smi stand-in: memory.reserved 0 */
    mem->used = used;
    mem->free = total - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->unavailable & UNAV_CC) return NVML_ERROR_NOT_SUPPORTED;
    *major = device->cc_major;
    *minor = device->cc_minor;
    return NVML_SUCCESS;
}

/* the NVML contract: *count too small (or infos NULL with processes running)
 * -> *count = needed, NVML_ERROR_INSUFFICIENT_SIZE */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, int v1) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    holding_t *list;
    int n = holdings_for(device->index, &list);
    if ((unsigned int)n > *count || (n > 0 && !infos)) {
        *count = (unsigned int)n;
        free(list);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        unsigned long long bytes =
            device->unavailable & UNAV_APP_MEMORY ? NVML_VALUE_NOT_AVAILABLE_ULL : list[i].mib * MIB;
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = list[i].pid;
            p->usedGpuMemory = bytes;
        } else {
            nvmlProcessInfo_t *p = (nvmlProcessInfo_t *)infos + i;
            p->pid = list[i].pid;
            p->usedGpuMemory = bytes;
            p->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* MIG disabled */
            p->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *count = (unsigned int)n;
    free(list);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return processes(device, infoCount, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos) {
    return processes(device, infoCount, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos) {
    return processes(device, infoCount, infos, 1);
}

/* no graphics or MPS clients on the simulated GPUs */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    (void)i;
    return no_processes(d, c);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i) {
    (void)i;
    return no_processes(d, c);
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int p2pIndex,
                                           int *p2pStatus) {
    nvmlReturn_t r = check_device(device1);
    if (r || (r = check_device(device2))) return r;
    if (!p2pStatus || p2pIndex < 0 || p2pIndex >= (int)(sizeof(P2P_CAPS) - 1)) return NVML_ERROR_INVALID_ARGUMENT;
    *p2pStatus = g_p2p[p2pIndex][device1 - g_dev][device2 - g_dev];
    return NVML_SUCCESS;
}

/* PCIe GPUs: no NVLink fabric */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, void *info) {
    nvmlReturn_t r = check_device(device);
    if (r) return r;
    return info ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *info) {
    return nvmlDeviceGetGpuFabricInfo(device, info);
}
