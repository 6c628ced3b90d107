package worker

import (
	"context"
	"sync"

	"github.com/llmq/llmq/internal/store"
)

// maxGroup caps the results one commit holds.
const maxGroup = 64

// commits groups the results of jobs that finish together into one
// transaction (store.JobCompleteMany), as a database groups commits: the
// first run to finish while no commit is under way commits at once, alone;
// runs that finish meanwhile queue, and the next commit takes them all. No
// run waits for a timer, and each returns only once its own result is
// committed, so its task is acked after its commit as before.
type commits struct {
	db *store.DB

	mu    sync.Mutex
	queue []*pendingCommit
	busy  bool // a run is committing (the leader)

	// beforeCommit, when set (tests), is called by a leader before it
	// takes its group.
	beforeCommit func()
	groups       int // commits made, for tests; under mu
}

type pendingCommit struct {
	p    *store.JobCompleteParams
	res  *store.JobCompleteResult
	err  error
	done bool          // res and err are set
	wake chan struct{} // done, or this run leads the next commit
}

// complete stores p's result, in a commit shared with the runs that finish
// while another commit is under way.
func (c *commits) complete(ctx context.Context, p *store.JobCompleteParams) (*store.JobCompleteResult, error) {
	w := &pendingCommit{p: p, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, w)
	lead := !c.busy
	c.busy = true
	c.mu.Unlock()
	if !lead {
		<-w.wake
		if w.done {
			return w.res, w.err
		}
	}
	// Leading: w is first in the queue (a leader hands over to the
	// oldest waiter, and the queue is empty when nobody leads).
	if c.beforeCommit != nil {
		c.beforeCommit()
	}
	c.mu.Lock()
	c.groups++
	n := min(len(c.queue), maxGroup)
	group := make([]*pendingCommit, n)
	copy(group, c.queue)
	c.queue = c.queue[n:]
	c.mu.Unlock()

	ps := &store.JobCompleteManyParams{Jobs: make([]*store.JobCompleteParams, n)}
	for i, g := range group {
		ps.Jobs[i] = g.p
	}
	// The commit holds others' results too: it is not cut short by this
	// run's cancellation.
	res, errs := c.db.JobCompleteMany(context.WithoutCancel(ctx), ps)

	c.mu.Lock()
	for i, g := range group {
		g.res, g.err, g.done = res[i], errs[i], true
		if g != w {
			g.wake <- struct{}{}
		}
	}
	if len(c.queue) > 0 {
		c.queue[0].wake <- struct{}{} // not done: it leads the next commit
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	return w.res, w.err
}
