package main

import (
	"maps"
	"slices"
	"time"

	"github.com/llmq/llmq/client"
)

// waitJobs follows the submitted jobs until each has finished. Rather than
// asking for each job, it reads the tenant's job list newest first down to
// the oldest job still pending (ids sort by creation), a page of 1,000 jobs
// per request, and sleeps poll between rounds.
func (c *cli) waitJobs(cl *client.Client, lines []*jobLine, poll time.Duration, bar *progress) error {
	pending := map[string]*jobLine{}
	var done, failed int64
	for _, l := range lines {
		switch {
		case l.jobID != "":
			pending[l.jobID] = l
		case l.failed:
			failed++
		}
	}
	total := int64(len(lines))
	// The bar's first count is the first round's: jobs that finished while
	// the file was being sent are not counted as finished at once.
	for len(pending) > 0 {
		oldest := slices.Min(slices.Collect(maps.Keys(pending)))
		for j, err := range cl.Jobs.All(c.ctx, &client.JobListParams{Limit: 1000}) {
			if err != nil {
				return err
			}
			if j.ID < oldest {
				break
			}
			l := pending[j.ID]
			if l == nil || !j.Finished() {
				continue
			}
			delete(pending, j.ID)
			l.result = &client.BatchResult{ID: j.ID, CustomID: l.params.CustomID, Response: j.Response}
			if j.Status == "succeeded" {
				done++
				continue
			}
			failed++
			l.failed = true
			e := &client.BatchLineError{Code: client.Code("job_" + j.Status), Message: "The job was " + j.Status + "."}
			if j.Error != nil {
				e = &client.BatchLineError{Code: j.Error.Code, Message: j.Error.Message}
			}
			l.result.Error = e
		}
		bar.update(done, failed, total)
		if len(pending) > 0 {
			select {
			case <-time.After(poll):
			case <-c.ctx.Done():
				return c.ctx.Err()
			}
		}
	}
	return nil
}
