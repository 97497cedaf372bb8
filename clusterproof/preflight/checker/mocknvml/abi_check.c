/*
 * Compile-time proof that cnvml.h matches NVIDIA's nvml.h: same sizes, same
 * field offsets. nvml.h comes from the go-nvml module in the Go module cache
 * (clusterproof/provision/toolchain.py puts its directory on CGO_CFLAGS); a build without it
 * fails here rather than shipping a library with a guessed ABI.
 */
#include <stddef.h>
#include <nvml.h>
#include "cnvml.h"

char cp_device_slots[CP_MAX_DEVICES];
char cp_event_set_slots[CP_MAX_EVENT_SETS];

#define SAME(a, b) _Static_assert(sizeof(a) == sizeof(b), "size of " #a " differs from " #b)
#define AT(a, b, f) _Static_assert(offsetof(a, f) == offsetof(b, f), #f " of " #a " differs from " #b)

SAME(cp_return_t, nvmlReturn_t);
SAME(cp_device_t, nvmlDevice_t);
SAME(cp_event_set_t, nvmlEventSet_t);
SAME(cp_event_data_t, nvmlEventData_t);
AT(cp_event_data_t, nvmlEventData_t, device);
AT(cp_event_data_t, nvmlEventData_t, eventType);
AT(cp_event_data_t, nvmlEventData_t, eventData);
AT(cp_event_data_t, nvmlEventData_t, gpuInstanceId);
AT(cp_event_data_t, nvmlEventData_t, computeInstanceId);
SAME(cp_pci_info_t, nvmlPciInfo_t);
AT(cp_pci_info_t, nvmlPciInfo_t, busIdLegacy);
AT(cp_pci_info_t, nvmlPciInfo_t, domain);
AT(cp_pci_info_t, nvmlPciInfo_t, bus);
AT(cp_pci_info_t, nvmlPciInfo_t, device);
AT(cp_pci_info_t, nvmlPciInfo_t, pciDeviceId);
AT(cp_pci_info_t, nvmlPciInfo_t, pciSubSystemId);
AT(cp_pci_info_t, nvmlPciInfo_t, busId);
/* The enum values the exports rely on. */
_Static_assert(NVML_SUCCESS == 0 && NVML_ERROR_UNINITIALIZED == 1 && NVML_ERROR_INVALID_ARGUMENT == 2 &&
               NVML_ERROR_NOT_SUPPORTED == 3 && NVML_ERROR_DRIVER_NOT_LOADED == 9 && NVML_ERROR_TIMEOUT == 10 &&
               NVML_ERROR_GPU_IS_LOST == 15 && NVML_ERROR_LIB_RM_VERSION_MISMATCH == 18 &&
               NVML_ERROR_UNKNOWN == 999, "nvmlReturn_t values");
_Static_assert(nvmlEventTypeXidCriticalError == 8ULL, "nvmlEventTypeXidCriticalError");
_Static_assert(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN == 0 && NVML_TEMPERATURE_THRESHOLD_SLOWDOWN == 1,
               "temperature thresholds");
_Static_assert(NVML_MEMORY_ERROR_TYPE_UNCORRECTED == 1 && NVML_VOLATILE_ECC == 0, "ECC counter selectors");
