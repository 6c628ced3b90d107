package queue

// The priorities of jobs: Critical, Default and Low are the ones a tier (or
// a job) chooses; Batch runs batch lines below all interactive work.
const (
	Critical = "critical"
	Default  = "default"
	Low      = "low"
	Batch    = "batch"
)

// Priorities are the priorities a job may have, highest first.
var Priorities = []string{Critical, Default, Low, Batch}

// weights are the priorities' shares when all have work.
var weights = map[string]int{Critical: 8, Default: 4, Low: 2, Batch: 1}

// Weight is priority's share (0 for an unknown priority).
func Weight(priority string) int { return weights[priority] }

// ValidPriority reports whether p names a priority.
func ValidPriority(p string) bool {
	_, ok := weights[p]
	return ok
}
