package task_test

import (
	"encoding/json"
	"fmt"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func ExampleParseDuration() {
	for _, s := range []string{"PT72H", "P1DT12H", "PT0.5S", "P1M", "-PT1H", "PT"} {
		d, err := task.ParseDuration(s)
		fmt.Println(d, err)
	}
	fmt.Println(task.FormatDuration(36 * 60 * 60 * 1e9))
	// Output:
	// 72h0m0s <nil>
	// 36h0m0s <nil>
	// 500ms <nil>
	// 0s invalid ISO 8601 duration "P1M": years and months have no fixed length; use weeks (W), days (D) or hours (H)
	// 0s invalid ISO 8601 duration "-PT1H": negative durations are not allowed
	// 0s invalid ISO 8601 duration "PT": a time designator T must be followed by hours, minutes or seconds
	// PT36H
}

func ExampleTaskSubmit_Validate() {
	var s task.TaskSubmit
	_ = json.Unmarshal([]byte(`{
		"caller_id": "Alpha", "callee_id": "lab-cvd", "capability": "cvd.grow",
		"intent": "grow a film", "inputs": {"image": "data:image/png;base64,iVBORw0KGgo="},
		"constraints": {"max_duration": "PT72H", "max_risk_level": "R3"}
	}`), &s)
	fmt.Println(s.Validate())
	// Output:
	// invalid task_submit: caller_id: "Alpha" is not a valid id (lowercase letters, digits, '-' and '_', 1-63 characters, starting and ending with a letter or digit); inputs.image: inline binary data (a base64 data: URI) is not allowed; reference binary data by URI
}
