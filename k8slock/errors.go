package k8slock

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrConflict: a Create or Update was refused because the record is not
// this Lock's to write: another lease on the name is live, or this Lock's
// own lease ended before it was renewed (SPEC S1, S4). Detail:
// *ConflictError.
var ErrConflict = errors.New("conflict")

// errAlreadyHeld is the cause of a Create while this Lock holds a lease.
var errAlreadyHeld = errors.New("this Lock already holds a lease on the name")

// ConflictError reports a refused Create or Update. It matches ErrConflict
// (errors.Is) and is a Kubernetes API status (apierrors.APIStatus): an
// AlreadyExists for Create, a Conflict for Update, as client-go expects
// from a lock whose record changed under it.
type ConflictError struct {
	Op   string // "create" or "update"
	Name string // the lock's name (the lease's key)
	// Err is the cause: a *lock.LockedError (matching lock.ErrLocked) that
	// names the live lease, lock.ErrReentrant when another acquire of this
	// Locker holds the key, or a *lock.LeaseLostError (matching
	// lock.ErrLeaseLost) when a renewal found this Lock's lease gone.
	Err error
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("k8slock: %s %q: conflict: %v", e.Op, e.Name, e.Err)
}

// Is matches ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Unwrap returns the cause, Err.
func (e *ConflictError) Unwrap() error { return e.Err }

// Status returns the Kubernetes API status of the error, so that
// apierrors.IsAlreadyExists (Create) or apierrors.IsConflict (Update)
// reports it.
func (e *ConflictError) Status() metav1.Status {
	if e.Op == "create" {
		return apierrors.NewAlreadyExists(Resource, e.Name).Status()
	}
	return apierrors.NewConflict(Resource, e.Name, e.Err).Status()
}
