package manifest

import "errors"

// CheckHostPath says why p cannot be a path a manifest declares: not
// absolute, not clean, or the system's (Forbidden). Tools that write
// manifests (`mesh import compose --root`) ask before they write one.
func CheckHostPath(p string) error {
	if msg := checkPath(p); msg != "" {
		return errors.New(msg)
	}
	return nil
}
