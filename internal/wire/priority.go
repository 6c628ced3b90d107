package wire

// Priorities, highest first: the queue a job runs in. A tier runs at one of
// the first three and a job may ask for its tier's or a lower one; batch
// lines run at PriorityBatch, below all interactive work.
const (
	PriorityCritical = "critical"
	PriorityDefault  = "default"
	PriorityLow      = "low"
	PriorityBatch    = "batch"
)
