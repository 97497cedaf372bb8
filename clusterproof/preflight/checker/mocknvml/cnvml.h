/*
 * The C types of the NVML functions this library exports, declared under our
 * own names (cp_*) so that the cgo export header never clashes with nvml.h
 * (nvml.h declares e.g. `const char *nvmlErrorString(...)`, which a Go export
 * cannot spell). abi_check.c proves, at compile time, that every type here
 * has the size and field offsets of its nvml.h counterpart -- nvml.h is read
 * from the go-nvml module in the Go module cache (the toolchain passes its
 * directory in CGO_CFLAGS), never copied into this repository.
 */
#ifndef CLUSTERPROOF_CNVML_H
#define CLUSTERPROOF_CNVML_H

typedef unsigned int cp_return_t;                /* nvmlReturn_t (an enum) */
typedef struct cp_device_st *cp_device_t;        /* nvmlDevice_t (opaque handle) */
typedef struct cp_event_set_st *cp_event_set_t;  /* nvmlEventSet_t (opaque handle) */

typedef struct {                                 /* nvmlEventData_t */
    cp_device_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} cp_event_data_t;

typedef struct {                                 /* nvmlPciInfo_t */
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} cp_pci_info_t;

/* Handles are addresses inside these static arrays (never Go pointers, which
 * C may not keep): device i of the current machine, event set i. */
#define CP_MAX_DEVICES 64
#define CP_MAX_EVENT_SETS 256
extern char cp_device_slots[CP_MAX_DEVICES];
extern char cp_event_set_slots[CP_MAX_EVENT_SETS];

static inline cp_device_t cp_device_handle(int i) { return (cp_device_t)&cp_device_slots[i]; }
static inline int cp_device_index(cp_device_t d) {
    long off = (char *)d - cp_device_slots;
    return (d != 0 && off >= 0 && off < CP_MAX_DEVICES) ? (int)off : -1;
}
static inline cp_event_set_t cp_event_set_handle(int i) { return (cp_event_set_t)&cp_event_set_slots[i]; }
static inline int cp_event_set_index(cp_event_set_t s) {
    long off = (char *)s - cp_event_set_slots;
    return (s != 0 && off >= 0 && off < CP_MAX_EVENT_SETS) ? (int)off : -1;
}
static inline void cp_copy_string(char *dst, unsigned int n, const char *src) {
    unsigned int i = 0;
    if (n == 0) return;
    for (; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = 0;
}
static inline unsigned int cp_strlen(const char *s) { unsigned int n = 0; while (s[n]) n++; return n; }

#endif
