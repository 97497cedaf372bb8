package main

// Simulated machines: go-nvml's mock DGX servers, with the faults a file
// declares for each machine.
//
// Which machine answers is decided at every first nvmlInit (reference count
// 0 -> 1) from two environment variables, read with the C library's getenv
// so that a process switching machines with putenv (Python's os.environ) is
// seen:
//
//	CLUSTERPROOF_NVML_FAULTS   path of the fault file (JSON, below); unset: healthy machines
//	CLUSTERPROOF_NVML_MACHINE  name of the machine to serve; unset or not listed: "default"
//
// One process can so check thousands of simulated nodes one after the other
// (init, check, shutdown) without a process per node. The fault file is
// parsed once per change (path, size, mtime), so a harness that rewrites it
// mid-run (a node going bad in service) is seen at the next init.
//
// Fault file:
//
//	{"default": {"model": "dgxh100"},
//	 "machines": {"node-7": {"model": "dgxa100", "driver": "",
//	                         "gpus": {"3": {"xid": [79], "ecc_uncorrected": 2}}}}}
//
// Per GPU: missing (not enumerated), lost (handle: NVML_ERROR_GPU_IS_LOST),
// ecc_uncorrected / ecc_corrected (volatile counts), remap_failure,
// remap_pending, remapped_correctable / remapped_uncorrectable (row counts),
// xid (XID events delivered to an event set registered for
// nvmlEventTypeXidCriticalError, as if they occurred while the checker
// watched), nvlink_down (link numbers), pcie_width / pcie_gen (current link,
// below the model's maximum), temperature_c, clock_events (names, see
// clockEventBits). Machine: model (dgxh100 | dgxa100), driver ("" |
// "mismatch": nvmlInit fails with NVML_ERROR_LIB_RM_VERSION_MISMATCH |
// "not-loaded": NVML_ERROR_DRIVER_NOT_LOADED). Unknown keys are errors: a
// typo must not silently mean "healthy".

import (
	"bytes"
	"crypto/sha1"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

type gpuFault struct {
	Missing               bool     `json:"missing"`
	Lost                  bool     `json:"lost"`
	EccUncorrected        uint64   `json:"ecc_uncorrected"`
	EccCorrected          uint64   `json:"ecc_corrected"`
	RemapFailure          bool     `json:"remap_failure"`
	RemapPending          bool     `json:"remap_pending"`
	RemappedCorrectable   int      `json:"remapped_correctable"`
	RemappedUncorrectable int      `json:"remapped_uncorrectable"`
	Xid                   []uint64 `json:"xid"`
	NvlinkDown            []int    `json:"nvlink_down"`
	PcieWidth             int      `json:"pcie_width"`
	PcieGen               int      `json:"pcie_gen"`
	TemperatureC          int      `json:"temperature_c"`
	ClockEvents           []string `json:"clock_events"`
}

type machineFaults struct {
	Model  string              `json:"model"`
	Driver string              `json:"driver"`
	GPUs   map[string]gpuFault `json:"gpus"`
}

type faultFile struct {
	Default  *machineFaults           `json:"default"`
	Machines map[string]machineFaults `json:"machines"`
}

// A machine model: what a healthy GPU of that box reports.
type model struct {
	build       func() *server.Server
	nvlinks     int
	pcieGen     int
	pcieWidth   int
	idleTempC   uint32
	slowdownC   uint32
	shutdownC   uint32
	supportedEv uint64
}

const (
	evSingleBitEcc = 0x1
	evDoubleBitEcc = 0x2
	evPState       = 0x4
	evXid          = 0x8
	evClock        = 0x10
)

// Data sheet values of the two DGX generations go-nvml models.
var models = map[string]model{
	"dgxh100": {dgxh100.New, 18, 5, 16, 33, 90, 92, evSingleBitEcc | evDoubleBitEcc | evPState | evXid | evClock},
	"dgxa100": {dgxa100.New, 12, 4, 16, 31, 89, 92, evSingleBitEcc | evDoubleBitEcc | evPState | evXid | evClock},
}

// NVML's clock event reason bits (nvmlClocksEventReason*).
var clockEventBits = map[string]uint64{
	"gpu_idle": 0x1, "applications_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
	"sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
	"hw_power_brake_slowdown": 0x80, "display_clocks": 0x100,
}

// gpu is one simulated device: go-nvml's mock device plus what the exports need.
type gpu struct {
	dev    *server.Device
	lost   bool
	xids   []uint64
	busID  string
	pciDev uint32
}

// machine is what the library serves between nvmlInit and the last nvmlShutdown.
type machine struct {
	name   string
	srv    *server.Server
	gpus   []*gpu
	driver string
}

var (
	cacheMu  sync.Mutex
	cacheKey string
	cached   *faultFile
)

// loadFaults reads the fault file (cached until it changes). An error is one line naming the file.
func loadFaults(path string) (*faultFile, error) {
	if path == "" {
		return &faultFile{}, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("fault file %s cannot be read: %v", path, err)
	}
	// The inode too: the harness replaces the file atomically (rename), maybe within one mtime tick.
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	key := fmt.Sprintf("%s|%d|%d|%d", path, ino, st.Size(), st.ModTime().UnixNano())
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if key == cacheKey && cached != nil {
		return cached, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fault file %s cannot be read: %v", path, err)
	}
	var ff faultFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ff); err != nil {
		return nil, fmt.Errorf("fault file %s does not parse: %s", path, describeJSONError(data, err))
	}
	all := map[string]machineFaults{}
	for name, m := range ff.Machines {
		all[name] = m
	}
	if ff.Default != nil {
		all["default"] = *ff.Default
	}
	for name, m := range all {
		if err := validate(m); err != nil {
			return nil, fmt.Errorf("fault file %s: machine %q: %v", path, name, err)
		}
	}
	cacheKey, cached = key, &ff
	return cached, nil
}

func describeJSONError(data []byte, err error) string {
	if se, ok := err.(*json.SyntaxError); ok {
		line := 1 + bytes.Count(data[:se.Offset], []byte("\n"))
		return fmt.Sprintf("line %d: %v", line, se)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func validate(m machineFaults) error {
	mod := m.Model
	if mod == "" {
		mod = "dgxh100"
	}
	md, ok := models[mod]
	if !ok {
		return fmt.Errorf("unknown model %q (dgxh100 or dgxa100)", m.Model)
	}
	if m.Driver != "" && m.Driver != "mismatch" && m.Driver != "not-loaded" {
		return fmt.Errorf("driver %q must be \"\", \"mismatch\" or \"not-loaded\"", m.Driver)
	}
	for idx, g := range m.GPUs {
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= 8 {
			return fmt.Errorf("gpu %q is not an index 0-7", idx)
		}
		for _, l := range g.NvlinkDown {
			if l < 0 || l >= md.nvlinks {
				return fmt.Errorf("gpu %s: nvlink %d does not exist (%s has links 0-%d)", idx, l, mod, md.nvlinks-1)
			}
		}
		for _, name := range g.ClockEvents {
			if _, ok := clockEventBits[name]; !ok {
				return fmt.Errorf("gpu %s: unknown clock event %q", idx, name)
			}
		}
	}
	return nil
}

// newMachine builds the machine named name from go-nvml's mock server of its model and its faults.
func newMachine(name string, ff *faultFile) *machine {
	mf, ok := ff.Machines[name]
	if !ok {
		if ff.Default != nil {
			mf = *ff.Default
		}
		if name == "" {
			name = "default"
		}
	}
	if mf.Model == "" {
		mf.Model = "dgxh100"
	}
	md := models[mf.Model]
	srv := md.build()
	m := &machine{name: name, srv: srv, driver: mf.Driver}
	var present []nvml.Device
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		f := mf.GPUs[strconv.Itoa(i)]
		if f.Missing {
			continue // fell off the bus before the driver enumerated it
		}
		// Stable identities: the same machine has the same GPUs in every process.
		sum := sha1.Sum([]byte(fmt.Sprintf("%s/%d", name, i)))
		dev.UUID = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		g := &gpu{dev: dev, lost: f.Lost, xids: append([]uint64(nil), f.Xid...),
			busID: fmt.Sprintf("00000000:%02X:00.0", 0x18+0x10*i), pciDev: dev.Config.PciDeviceId}
		configure(dev, md, f)
		present = append(present, dev)
		m.gpus = append(m.gpus, g)
	}
	srv.Devices = present
	return m
}

// configure sets go-nvml mock device functions to what the device reports, faults included.
func configure(dev *server.Device, md model, f gpuFault) {
	dev.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return f.EccUncorrected, nvml.SUCCESS
		}
		return f.EccCorrected, nvml.SUCCESS
	}
	dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		return f.RemappedCorrectable, f.RemappedUncorrectable, f.RemapPending, f.RemapFailure, nvml.SUCCESS
	}
	down := map[int]bool{}
	for _, l := range f.NvlinkDown {
		down[l] = true
	}
	dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if link < 0 || link >= md.nvlinks {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if down[link] {
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	gen, width := md.pcieGen, md.pcieWidth
	if f.PcieGen > 0 {
		gen = f.PcieGen
	}
	if f.PcieWidth > 0 {
		width = f.PcieWidth
	}
	dev.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return gen, nvml.SUCCESS }
	dev.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { return width, nvml.SUCCESS }
	dev.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return md.pcieGen, nvml.SUCCESS }
	dev.GetGpuMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return md.pcieGen, nvml.SUCCESS }
	dev.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return md.pcieWidth, nvml.SUCCESS }
	temp := md.idleTempC
	if f.TemperatureC > 0 {
		temp = uint32(f.TemperatureC)
	}
	dev.GetTemperatureFunc = func(s nvml.TemperatureSensors) (uint32, nvml.Return) {
		if s != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return temp, nvml.SUCCESS
	}
	dev.GetTemperatureThresholdFunc = func(t nvml.TemperatureThresholds) (uint32, nvml.Return) {
		switch t {
		case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
			return md.slowdownC, nvml.SUCCESS
		case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
			return md.shutdownC, nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	// A healthy, unused GPU reports only "idle"; faults add their reasons.
	reasons := uint64(clockEventBits["gpu_idle"])
	if len(f.ClockEvents) > 0 {
		reasons = 0
		for _, name := range f.ClockEvents {
			reasons |= clockEventBits[name]
		}
	}
	dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return reasons, nvml.SUCCESS }
	dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return md.supportedEv, nvml.SUCCESS }
}

// eventSet: XID events of the devices registered with it, delivered in order.
type eventSet struct {
	mu         sync.Mutex
	pending    []event
	lastDevice int // device of the event Wait returned last (nvmlEventData_t.device)
	set        *mock.EventSet
}

type event struct {
	device int
	kind   uint64
	data   uint64
}

func newEventSet() *eventSet {
	es := &eventSet{}
	es.set = &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			es.mu.Lock()
			if len(es.pending) > 0 {
				e := es.pending[0]
				es.pending = es.pending[1:]
				es.lastDevice = e.device
				es.mu.Unlock()
				return nvml.EventData{EventType: e.kind, EventData: e.data, GpuInstanceId: 0xFFFFFFFF,
					ComputeInstanceId: 0xFFFFFFFF}, nvml.SUCCESS
			}
			es.mu.Unlock()
			// Nothing happened: like the real library, wait out the timeout.
			time.Sleep(time.Duration(timeoutMs) * time.Millisecond)
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	return es
}

// register queues the device's XIDs (sorted for a stable order) if XID events are asked for.
func (es *eventSet) register(device int, g *gpu, types uint64) {
	if types&evXid == 0 {
		return
	}
	xids := append([]uint64(nil), g.xids...)
	sort.Slice(xids, func(a, b int) bool { return xids[a] < xids[b] })
	es.mu.Lock()
	defer es.mu.Unlock()
	for _, x := range xids {
		es.pending = append(es.pending, event{device, evXid, x})
	}
}
