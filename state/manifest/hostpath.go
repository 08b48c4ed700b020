package manifest

import "errors"

// DataDirs lists the module's data directories (data: true), in order.
func (m *Manifest) DataDirs() []string {
	var out []string
	for _, r := range m.Resources {
		if r.Directory != "" && r.Data {
			out = append(out, r.Directory)
		}
	}
	return out
}

// CheckHostPath says why p cannot be a path a manifest declares: not
// absolute, not clean, or the system's (Forbidden). Tools that write
// manifests (`mesh import compose --root`) ask before they write one.
func CheckHostPath(p string) error {
	if msg := checkPath(p); msg != "" {
		return errors.New(msg)
	}
	return nil
}
