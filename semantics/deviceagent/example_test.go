package deviceagent_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"forgeyard.dev/transport/semantics/deviceagent"
)

// ExampleSimDriver: the simulated driver installs a test list and runs a
// suite of it, reporting each test on the run's log.
func ExampleSimDriver() {
	drv := deviceagent.NewSimDriver(deviceagent.Device{ID: "emulator-5554", Model: "Pixel (sim)", Platform: "android", Online: true})
	ctx := context.Background()
	msg, _ := drv.Install(ctx, "emulator-5554", strings.NewReader("suite smoke\ntest boot pass\ntest login fail\n"))
	fmt.Println(msg)
	res, _ := drv.RunTest(ctx, "emulator-5554", deviceagent.TestRun{Suite: "smoke", Log: os.Stdout})
	fmt.Println(res.Passed, res.Failed)
	// Output:
	// installed 1 suites, 2 tests
	// running suite smoke on emulator-5554
	// PASS boot
	// FAIL login
	// 1 passed, 1 failed
	// 1 1
}
