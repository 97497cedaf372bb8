package main

// The NVML C functions the preflight checker calls through pynvml (and the
// ones pynvml itself needs: nvmlInitWithFlags, nvmlShutdown,
// nvmlErrorString), exported under their real symbol names -- pynvml
// resolves e.g. nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2 and
// nvmlEventSetWait_v2, so those are the names here. Every answer comes from
// the current machine (machines.go) through go-nvml's nvml.Interface /
// nvml.Device API. A call before nvmlInit answers NVML_ERROR_UNINITIALIZED,
// as the real library does.

/*
#include <stdlib.h>
#include "cnvml.h"
*/
import "C"

import (
	"strconv"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {} // required by -buildmode=c-shared

var (
	mu        sync.Mutex
	refs      int
	cur       *machine
	lastError string // why the last nvmlInit failed with NVML_ERROR_UNKNOWN (nvmlErrorString tells)
	sets      = map[int]*eventSet{}
	cstrings  = map[string]*C.char{}
)

const (
	success        = C.cp_return_t(nvml.SUCCESS)
	uninitialized  = C.cp_return_t(nvml.ERROR_UNINITIALIZED)
	invalid        = C.cp_return_t(nvml.ERROR_INVALID_ARGUMENT)
	notSupported   = C.cp_return_t(nvml.ERROR_NOT_SUPPORTED)
	insufficient   = C.cp_return_t(nvml.ERROR_INSUFFICIENT_SIZE)
	unknown        = C.cp_return_t(nvml.ERROR_UNKNOWN)
	maxEventSetErr = C.cp_return_t(nvml.ERROR_MEMORY)
)

// NVML's own texts for the codes this library returns.
var errorText = map[nvml.Return]string{
	nvml.SUCCESS:                       "Success",
	nvml.ERROR_UNINITIALIZED:           "Uninitialized",
	nvml.ERROR_INVALID_ARGUMENT:        "Invalid Argument",
	nvml.ERROR_NOT_SUPPORTED:           "Not Supported",
	nvml.ERROR_INSUFFICIENT_SIZE:       "Insufficient Size",
	nvml.ERROR_DRIVER_NOT_LOADED:       "Driver Not Loaded",
	nvml.ERROR_TIMEOUT:                 "Timeout",
	nvml.ERROR_GPU_IS_LOST:             "GPU is lost",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
	nvml.ERROR_MEMORY:                  "Insufficient Memory",
	nvml.ERROR_UNKNOWN:                 "Unknown Error",
}

func cstring(s string) *C.char {
	p, ok := cstrings[s]
	if !ok {
		p = C.CString(s)
		cstrings[s] = p
	}
	return p
}

func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if v := C.getenv(cname); v != nil {
		return C.GoString(v)
	}
	return ""
}

func initLocked() C.cp_return_t {
	if refs > 0 {
		refs++
		return success
	}
	ff, err := loadFaults(getenv("CLUSTERPROOF_NVML_FAULTS"))
	if err != nil {
		lastError = err.Error()
		return unknown
	}
	m := newMachine(getenv("CLUSTERPROOF_NVML_MACHINE"), ff)
	switch m.driver {
	case "mismatch":
		return C.cp_return_t(nvml.ERROR_LIB_RM_VERSION_MISMATCH)
	case "not-loaded":
		return C.cp_return_t(nvml.ERROR_DRIVER_NOT_LOADED)
	}
	if r := m.srv.Init(); r != nvml.SUCCESS {
		return C.cp_return_t(r)
	}
	lastError, cur, refs = "", m, 1
	return success
}

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	return initLocked()
}

//export nvmlInit_v2
func nvmlInit_v2() C.cp_return_t { return nvmlInitWithFlags(0) }

//export nvmlShutdown
func nvmlShutdown() C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	if refs == 0 {
		return uninitialized
	}
	refs--
	if refs == 0 {
		cur.srv.Shutdown()
		cur, sets = nil, map[int]*eventSet{}
	}
	return success
}

//export nvmlErrorString
func nvmlErrorString(r C.cp_return_t) *C.char {
	mu.Lock()
	defer mu.Unlock()
	if r == unknown && lastError != "" {
		return cstring(lastError)
	}
	if s, ok := errorText[nvml.Return(r)]; ok {
		return cstring(s)
	}
	return cstring("Unknown Error")
}

func putString(buf *C.char, n C.uint, s string) C.cp_return_t {
	if buf == nil {
		return invalid
	}
	if C.uint(len(s)+1) > n {
		return insufficient
	}
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	C.cp_copy_string(buf, n, cs)
	return success
}

// system serves one NVML query about the current machine through go-nvml's nvml.Interface.
func system[T any](get func(nvml.Interface) (T, nvml.Return), put func(T) C.cp_return_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return uninitialized
	}
	v, r := get(cur.srv)
	if r != nvml.SUCCESS {
		return C.cp_return_t(r)
	}
	return put(v)
}

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(buf *C.char, n C.uint) C.cp_return_t {
	return system(nvml.Interface.SystemGetDriverVersion, stringOut(buf, n))
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(buf *C.char, n C.uint) C.cp_return_t {
	return system(nvml.Interface.SystemGetNVMLVersion, stringOut(buf, n))
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(out *C.int) C.cp_return_t {
	return system(nvml.Interface.SystemGetCudaDriverVersion, func(v int) C.cp_return_t {
		if out == nil {
			return invalid
		}
		*out = C.int(v)
		return success
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(out *C.int) C.cp_return_t {
	return nvmlSystemGetCudaDriverVersion_v2(out)
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(out *C.uint) C.cp_return_t {
	return system(nvml.Interface.DeviceGetCount, uintOut(out))
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, out *C.cp_device_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return uninitialized
	}
	if out == nil {
		return invalid
	}
	if _, r := cur.srv.DeviceGetHandleByIndex(int(index)); r != nvml.SUCCESS {
		return C.cp_return_t(r)
	}
	if cur.gpus[index].lost {
		return C.cp_return_t(nvml.ERROR_GPU_IS_LOST)
	}
	*out = C.cp_device_handle(C.int(index))
	return success
}

// device resolves a handle of the current machine; the caller holds mu.
func device(d C.cp_device_t) (*gpu, int, C.cp_return_t) {
	if cur == nil {
		return nil, -1, uninitialized
	}
	i := int(C.cp_device_index(d))
	if i < 0 || i >= len(cur.gpus) {
		return nil, -1, invalid
	}
	if cur.gpus[i].lost {
		return nil, -1, C.cp_return_t(nvml.ERROR_GPU_IS_LOST)
	}
	return cur.gpus[i], i, success
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(d C.cp_device_t, buf *C.char, n C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (string, nvml.Return) { return g.dev.GetName() }, stringOut(buf, n))
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(d C.cp_device_t, buf *C.char, n C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (string, nvml.Return) { return g.dev.GetUUID() }, stringOut(buf, n))
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetIndex() }, uintOut(out))
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(d C.cp_device_t, out *C.cp_pci_info_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, r := device(d)
	if r != success {
		return r
	}
	if out == nil {
		return invalid
	}
	info, ret := g.dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return C.cp_return_t(ret)
	}
	bus, _ := strconv.ParseUint(g.busID[9:11], 16, 32)
	out.domain, out.bus, out.device = 0, C.uint(bus), 0
	out.pciDeviceId, out.pciSubSystemId = C.uint(info.PciDeviceId), C.uint(info.PciSubSystemId)
	id := C.CString(g.busID)
	defer C.free(unsafe.Pointer(id))
	C.cp_copy_string(&out.busId[0], 32, id)
	C.cp_copy_string(&out.busIdLegacy[0], 16, id)
	return success
}

//export nvmlDeviceGetTotalEccErrors
func nvmlDeviceGetTotalEccErrors(d C.cp_device_t, errorType C.uint, counterType C.uint, out *C.ulonglong) C.cp_return_t {
	return answer(d, func(g *gpu) (uint64, nvml.Return) {
		return g.dev.GetTotalEccErrors(nvml.MemoryErrorType(errorType), nvml.EccCounterType(counterType))
	}, ullOut(out))
}

//export nvmlDeviceGetRemappedRows
func nvmlDeviceGetRemappedRows(d C.cp_device_t, corr, unc, pending, failure *C.uint) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, r := device(d)
	if r != success {
		return r
	}
	c, u, p, f, ret := g.dev.GetRemappedRows()
	if ret != nvml.SUCCESS {
		return C.cp_return_t(ret)
	}
	if corr == nil || unc == nil || pending == nil || failure == nil {
		return invalid
	}
	*corr, *unc, *pending, *failure = C.uint(c), C.uint(u), cbool(p), cbool(f)
	return success
}

func cbool(b bool) C.uint {
	if b {
		return 1
	}
	return 0
}

//export nvmlDeviceGetNvLinkState
func nvmlDeviceGetNvLinkState(d C.cp_device_t, link C.uint, active *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) {
		s, r := g.dev.GetNvLinkState(int(link))
		return int(s), r
	}, uintOut(active))
}

// answer serves one NVML query about device d of the current machine: get reads it through
// go-nvml's nvml.Device, put stores it in the caller's out-parameter (and may refuse: a short buffer).
func answer[T any](d C.cp_device_t, get func(*gpu) (T, nvml.Return), put func(T) C.cp_return_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, r := device(d)
	if r != success {
		return r
	}
	v, ret := get(g)
	if ret != nvml.SUCCESS {
		return C.cp_return_t(ret)
	}
	return put(v)
}

func uintOut(out *C.uint) func(int) C.cp_return_t {
	return func(v int) C.cp_return_t {
		if out == nil {
			return invalid
		}
		*out = C.uint(v)
		return success
	}
}

func ullOut(out *C.ulonglong) func(uint64) C.cp_return_t {
	return func(v uint64) C.cp_return_t {
		if out == nil {
			return invalid
		}
		*out = C.ulonglong(v)
		return success
	}
}

func stringOut(buf *C.char, n C.uint) func(string) C.cp_return_t {
	return func(s string) C.cp_return_t { return putString(buf, n, s) }
}

//export nvmlDeviceGetCurrPcieLinkGeneration
func nvmlDeviceGetCurrPcieLinkGeneration(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetCurrPcieLinkGeneration() }, uintOut(out))
}

//export nvmlDeviceGetMaxPcieLinkGeneration
func nvmlDeviceGetMaxPcieLinkGeneration(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetMaxPcieLinkGeneration() }, uintOut(out))
}

//export nvmlDeviceGetGpuMaxPcieLinkGeneration
func nvmlDeviceGetGpuMaxPcieLinkGeneration(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetGpuMaxPcieLinkGeneration() }, uintOut(out))
}

//export nvmlDeviceGetCurrPcieLinkWidth
func nvmlDeviceGetCurrPcieLinkWidth(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetCurrPcieLinkWidth() }, uintOut(out))
}

//export nvmlDeviceGetMaxPcieLinkWidth
func nvmlDeviceGetMaxPcieLinkWidth(d C.cp_device_t, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) { return g.dev.GetMaxPcieLinkWidth() }, uintOut(out))
}

//export nvmlDeviceGetTemperature
func nvmlDeviceGetTemperature(d C.cp_device_t, sensor C.uint, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) {
		v, r := g.dev.GetTemperature(nvml.TemperatureSensors(sensor))
		return int(v), r
	}, uintOut(out))
}

//export nvmlDeviceGetTemperatureThreshold
func nvmlDeviceGetTemperatureThreshold(d C.cp_device_t, kind C.uint, out *C.uint) C.cp_return_t {
	return answer(d, func(g *gpu) (int, nvml.Return) {
		v, r := g.dev.GetTemperatureThreshold(nvml.TemperatureThresholds(kind))
		return int(v), r
	}, uintOut(out))
}

//export nvmlDeviceGetCurrentClocksEventReasons
func nvmlDeviceGetCurrentClocksEventReasons(d C.cp_device_t, out *C.ulonglong) C.cp_return_t {
	return answer(d, func(g *gpu) (uint64, nvml.Return) { return g.dev.GetCurrentClocksEventReasons() }, ullOut(out))
}

//export nvmlDeviceGetCurrentClocksThrottleReasons
func nvmlDeviceGetCurrentClocksThrottleReasons(d C.cp_device_t, out *C.ulonglong) C.cp_return_t {
	return nvmlDeviceGetCurrentClocksEventReasons(d, out)
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(d C.cp_device_t, out *C.ulonglong) C.cp_return_t {
	return answer(d, func(g *gpu) (uint64, nvml.Return) { return g.dev.GetSupportedEventTypes() }, ullOut(out))
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(out *C.cp_event_set_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return uninitialized
	}
	if out == nil {
		return invalid
	}
	for i := 0; i < C.CP_MAX_EVENT_SETS; i++ {
		if _, used := sets[i]; !used {
			sets[i] = newEventSet()
			*out = C.cp_event_set_handle(C.int(i))
			return success
		}
	}
	return maxEventSetErr
}

func lookupSet(s C.cp_event_set_t) (*eventSet, int) {
	i := int(C.cp_event_set_index(s))
	return sets[i], i
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(d C.cp_device_t, types C.ulonglong, s C.cp_event_set_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	g, i, r := device(d)
	if r != success {
		return r
	}
	es, _ := lookupSet(s)
	if es == nil {
		return invalid
	}
	supported, _ := g.dev.GetSupportedEventTypes()
	if uint64(types)&^supported != 0 {
		return notSupported
	}
	es.register(i, g, uint64(types))
	return success
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(s C.cp_event_set_t, data *C.cp_event_data_t, timeoutMs C.uint) C.cp_return_t {
	mu.Lock()
	if cur == nil {
		mu.Unlock()
		return uninitialized
	}
	es, _ := lookupSet(s)
	mu.Unlock()
	if es == nil || data == nil {
		return invalid
	}
	// Not under mu: an empty wait sleeps for its timeout, like the real one.
	ev, ret := es.set.Wait(uint32(timeoutMs))
	if ret != nvml.SUCCESS {
		return C.cp_return_t(ret)
	}
	es.mu.Lock()
	dev := es.lastDevice
	es.mu.Unlock()
	data.device = C.cp_device_handle(C.int(dev))
	data.eventType, data.eventData = C.ulonglong(ev.EventType), C.ulonglong(ev.EventData)
	data.gpuInstanceId, data.computeInstanceId = C.uint(ev.GpuInstanceId), C.uint(ev.ComputeInstanceId)
	return success
}

//export nvmlEventSetWait
func nvmlEventSetWait(s C.cp_event_set_t, data *C.cp_event_data_t, timeoutMs C.uint) C.cp_return_t {
	return nvmlEventSetWait_v2(s, data, timeoutMs)
}

//export nvmlEventSetFree
func nvmlEventSetFree(s C.cp_event_set_t) C.cp_return_t {
	mu.Lock()
	defer mu.Unlock()
	if cur == nil {
		return uninitialized
	}
	es, i := lookupSet(s)
	if es == nil {
		return invalid
	}
	es.set.Free()
	delete(sets, i)
	return success
}
