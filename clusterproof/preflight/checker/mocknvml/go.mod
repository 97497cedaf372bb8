// The project's own mock libnvidia-ml.so.1 (cgo, -buildmode=c-shared): the
// NVML C functions the preflight checker calls, answered from go-nvml's mock
// DGX machines with per-GPU faults read from a file. Built and cached by
// clusterproof/provision/toolchain.py (component "mocknvml").
module clusterproof.local/mocknvml

go 1.26

require github.com/NVIDIA/go-nvml v0.13.4-1

require github.com/google/uuid v1.6.0 // indirect
