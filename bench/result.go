package bench

// Result is every figure of one run.
type Result struct {
	Scenario   string  `json:"scenario"`
	Transport  string  `json:"transport"`
	Procs      int     `json:"procs"`
	Size       int     `json:"size"`
	Peers      int     `json:"peers"`
	Window     int     `json:"window"`
	BusyPollUS float64 `json:"busy_poll_us"`

	Notifies   int64  `json:"notifies"` // measured notifies that completed
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`

	// OneWay is the delivery latency; OneWayMethod says how it was measured: "one clock"
	// (one process) or "rtt/2" (two processes: half the round trip of an echo).
	OneWay       *Summary `json:"one_way,omitempty"`
	OneWayMethod string   `json:"one_way_method,omitempty"`
	Call         *Summary `json:"call,omitempty"`    // duration of the send call
	Connect      *Summary `json:"connect,omitempty"` // first send to a cold peer

	ElapsedS  float64 `json:"elapsed_s"`
	OpsPerSec float64 `json:"ops_per_s"` // with repeats: the median run's
	// OpsRepeats is every repeat's ops/s, in run order (pipelined scenarios, Config.Repeat);
	// OpsMin and OpsMax bound them.
	OpsRepeats []float64 `json:"ops_per_s_repeats,omitempty"`
	OpsMin     float64   `json:"ops_per_s_min,omitempty"`
	OpsMax     float64   `json:"ops_per_s_max,omitempty"`
	MBPerSec   float64   `json:"mb_per_s"`

	CPUSelfUS           float64 `json:"cpu_self_us"`  // this process, measured phase
	CPUChildUS          float64 `json:"cpu_child_us"` // the receiving process (two processes)
	CPUSelfPerNotifyUS  float64 `json:"cpu_self_us_per_notify"`
	CPUChildPerNotifyUS float64 `json:"cpu_child_us_per_notify"`
	CPUPerNotifyUS      float64 `json:"cpu_us_per_notify"` // both processes
	CPUPercent          float64 `json:"cpu_percent"`       // both processes, % of one core

	Wakeups          uint64  `json:"wakeups"` // reactor epoll wake-ups, both processes
	WakeupsPerSec    float64 `json:"wakeups_per_s"`
	WakeupsPerNotify float64 `json:"wakeups_per_notify"`

	// VsFloor is the run's key figure against the floor of the same mode (floor-block, or
	// floor-spin with busy poll), as "times the floor": latency p50 / floor p50, or floor
	// ops/s / ops/s. 0 when there is no floor to compare with.
	VsFloor   float64 `json:"vs_floor,omitempty"`
	VsFloorOf string  `json:"vs_floor_of,omitempty"`

	// Breakdown: where a notify's time goes (two-process latency with an echo).
	Breakdown *Breakdown `json:"breakdown,omitempty"`
	// WakeupsSelf and WakeupsChild split Wakeups between the processes.
	WakeupsSelf  uint64 `json:"wakeups_self"`
	WakeupsChild uint64 `json:"wakeups_child"`
}

// fill derives the rates from the raw figures.
func (r *Result) fill(elapsedNS int64, bytes int64, cpuSelfNS, cpuChildNS int64, wakeups uint64) {
	r.ElapsedS = float64(elapsedNS) / 1e9
	r.CPUSelfUS = float64(cpuSelfNS) / 1e3
	r.CPUChildUS = float64(cpuChildNS) / 1e3
	r.Wakeups = wakeups
	if r.ElapsedS > 0 {
		r.OpsPerSec = float64(r.Notifies) / r.ElapsedS
		r.MBPerSec = float64(bytes) / r.ElapsedS / 1e6
		r.CPUPercent = (r.CPUSelfUS + r.CPUChildUS) / 1e6 / r.ElapsedS * 100
		r.WakeupsPerSec = float64(wakeups) / r.ElapsedS
	}
	if r.Notifies > 0 {
		n := float64(r.Notifies)
		r.CPUSelfPerNotifyUS = r.CPUSelfUS / n
		r.CPUChildPerNotifyUS = r.CPUChildUS / n
		r.CPUPerNotifyUS = (r.CPUSelfUS + r.CPUChildUS) / n
		r.WakeupsPerNotify = float64(wakeups) / n
	}
}

// Spread is (max − min) / median of the repeats' ops/s; 0 without repeats.
func (r *Result) Spread() float64 {
	if len(r.OpsRepeats) < 2 || r.OpsPerSec <= 0 {
		return 0
	}
	return (r.OpsMax - r.OpsMin) / r.OpsPerSec
}
