//go:build linux

package sqlitedialect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// notifyWatch is WatchChanges through inotify: a watch on the database's
// directory (not on its files, which it never opens) for writes to, and
// creation of, the database file and its "-wal" and "-journal" files.
// It returns an error matching errors.ErrUnsupported when inotify cannot be
// set up, so waiters poll.
func notifyWatch(ctx context.Context, path string, changed func(), ready func()) error {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("sqlitedialect: inotify: %w: %w", err, errors.ErrUnsupported)
	}
	// A non-blocking descriptor in an *os.File waits in the runtime's
	// poller, so Close (when ctx ends) ends a pending Read.
	f := os.NewFile(uintptr(fd), "inotify")
	dir, base := filepath.Dir(path), filepath.Base(path)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_MODIFY|unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		_ = f.Close()
		return fmt.Errorf("sqlitedialect: inotify watch of %s: %w: %w", dir, err, errors.ErrUnsupported)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan struct{}, 1)
	readErr := make(chan error, 1)
	go func() {
		readErr <- readEvents(ctx, f, map[string]bool{base: true, base + "-wal": true, base + "-journal": true}, events)
	}()
	defer func() { _ = f.Close(); <-readErr }()

	ready()
	follow := time.NewTimer(time.Hour)
	follow.Stop()
	defer follow.Stop()
	step := len(followUps)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-readErr:
			readErr <- err // for the deferred receive
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("sqlitedialect: read inotify events: %w", err)
		case <-events:
			changed()
			step = 0
			follow.Reset(followUps[0])
		case <-follow.C:
			changed()
			step++
			if step < len(followUps) {
				follow.Reset(followUps[step] - followUps[step-1])
			}
		}
	}
}

// readEvents reads inotify events from f and signals events (coalesced)
// for those that name one of names, or an overflow, until f fails or is
// closed.
func readEvents(ctx context.Context, f *os.File, names map[string]bool, events chan<- struct{}) error {
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := f.Read(buf)
		if err != nil {
			return err
		}
		hit := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			end := off + unix.SizeofInotifyEvent + int(ev.Len)
			if end > n {
				break
			}
			name := buf[off+unix.SizeofInotifyEvent : end]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			if names[string(name)] || ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				hit = true
			}
			off = end
		}
		if hit {
			select {
			case events <- struct{}{}:
			default:
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
