// perfdata-reader: reads a PerfData file the way perfdash does, for the export self-test
// (tests/test_export.py). The project's own code; built by clusterproof.provision.toolchain
// (PERFDATA_READER) against k8s.io/kubernetes at the pinned control-plane version.
//
// Why this and not perfdash: perfdash (k8s.io/perf-tests/perfdash) is not served by the Go
// module proxy, and its parsers live in package main. What it does with a ClusterLoader2
// file is json.Unmarshal into k8s.io/kubernetes/test/e2e/perftype.PerfData and keep the
// builds whose Version matches ("v1"): this program does the same with the same type, then
// holds the file to what perfdash relies on (no field it would drop, a version, data in every
// item), and prints the decoded data back as JSON for the self-test to compare.
//
// Usage: perfdata-reader FILE. Exit 0 and the decoded PerfData on stdout; exit 1 and one
// line on stderr when perfdash would not read the file as PerfData v1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/kubernetes/test/e2e/perftype"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "perfdata-reader: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 2 {
		fail("usage: perfdata-reader FILE")
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	// perfdash: json.Unmarshal into perftype.PerfData; an error drops the whole file.
	obj := perftype.PerfData{}
	if err := json.Unmarshal(data, &obj); err != nil {
		fail("perfdash would drop this file: error parsing JSON: %v", err)
	}
	// A field perftype does not know is silently lost to perfdash: refuse it here.
	strict := json.NewDecoder(bytes.NewReader(data))
	strict.DisallowUnknownFields()
	if err := strict.Decode(&perftype.PerfData{}); err != nil {
		fail("a field perfdash would ignore: %v", err)
	}
	if obj.Version != "v1" {
		fail("version %q: perfdash plots a file only beside builds of the same version, ClusterLoader2's is \"v1\"", obj.Version)
	}
	if len(obj.DataItems) == 0 {
		fail("no dataItems: perfdash would plot nothing")
	}
	for i, item := range obj.DataItems {
		if len(item.Data) == 0 {
			fail("dataItems[%d] (labels %v) has no data: perfdash plots each key of data", i, item.Labels)
		}
		if len(item.Labels) == 0 {
			fail("dataItems[%d] has no labels: perfdash tells items apart by their labels", i)
		}
	}
	out, err := json.Marshal(obj)
	if err != nil {
		fail("%v", err)
	}
	fmt.Println(string(out))
}
