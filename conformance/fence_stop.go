package conformance

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// keepBusy sends a trivial statement on tx every 50 ms until the returned
// function is called (it waits for the last one), as a live holder working
// inside its fenced transaction would.
func keepBusy(ctx context.Context, tx *sql.Tx) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var one int
			_ = tx.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}
