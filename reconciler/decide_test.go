package reconciler

import (
	"strings"
	"testing"
)

// The take-over rule: the host never loses bytes it did not write. Each row
// is what the path holds, what the ledger says of it, and the file's
// take-over flag; the file wants content of digest "W".
func TestDecideFile(t *testing.T) {
	const name, keptDir = "/srv/app.ini", "/data/kept"
	file := func(digest string) pathState { return pathState{exists: true, digest: digest, content: []byte(digest)} }
	entry := func(digest, prev string) *PathEntry {
		return &PathEntry{Kind: "file", Module: "app", Digest: digest, Prev: prev}
	}
	for _, tc := range []struct {
		name     string
		have     pathState
		entry    *PathEntry
		takeOver bool
		action   fileAction
		message  string // a part of Message ("" when there must be none)
		note     string // Note, whole
		prev     string
	}{
		{"absent", pathState{}, nil, false, fileWrite, "", "", ""},
		{"absent, take-over declared", pathState{}, nil, true, fileWrite, "", "", ""},
		{"absent, in the ledger", pathState{}, entry("W", ""), false, fileWrite, "", "", ""},
		{"ours unchanged", file("W"), entry("W", ""), false, fileWrite, "", "", ""},
		{"ours, the manifest changed", file("A"), entry("A", ""), false, fileWrite, "", "", "A"},
		{"ours at prev (a crash between record and write)", file("A"), entry("W", "A"), false, fileWrite, "", "", "A"},
		{"ours edited since", file("E"), entry("A", "B"), false, fileCopyAside,
			"keep a copy of what is there before replacing it: ", "it was changed since the mesh wrote it; that content is kept at ", "E"},
		{"ours edited since, take-over declared", file("E"), entry("A", ""), true, fileCopyAside,
			"before replacing it: ", "it was changed since the mesh wrote it; that content is kept at ", "E"},
		{"ours edited into what is wanted", file("W"), entry("A", "B"), false, fileWrite, "", "", ""},
		{"not ours, other content", file("O"), nil, false, fileRefuse,
			"/srv/app.ini exists and the mesh did not write it; the mesh never overwrites bytes it did not write. Move it aside (mv /srv/app.ini /srv/app.ini.orig), or add `take-over: true` to the file in the manifest: its original is then kept in /data/kept and put back", "", "O"},
		{"not ours, same content", file("W"), nil, false, fileRefuse,
			"/srv/app.ini exists and the mesh did not write it (its content is already what the manifest says); move it aside (mv /srv/app.ini /srv/app.ini.orig), or add `take-over: true`", "", ""},
		{"not ours, other content, take-over", file("O"), nil, true, fileTakeOver,
			"keep a copy of what is there before replacing it: ", "taken over; the original is kept at ", "O"},
		{"not ours, same content, take-over", file("W"), nil, true, fileTakeOver,
			"keep a copy of what is there before taking it over: ", "taken over; the original is kept at ", ""},
		{"a directory", pathState{exists: true, isDir: true}, nil, false, fileRefuse, "exists and is a directory; move it aside", "", ""},
		{"a directory, take-over", pathState{exists: true, isDir: true}, entry("W", ""), true, fileRefuse, "exists and is a directory; move it aside", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideFile(name, tc.have, tc.entry, "W", tc.takeOver, keptDir)
			if d.Action != tc.action || d.Note != tc.note || d.Prev != tc.prev {
				t.Fatalf("got %s, note %q, prev %q; want %s, note %q, prev %q", d.Action, d.Note, d.Prev, tc.action, tc.note, tc.prev)
			}
			if tc.message == "" && d.Message != "" || !strings.Contains(d.Message, tc.message) {
				t.Fatalf("message %q, want it to hold %q", d.Message, tc.message)
			}
		})
	}
}

func TestPullDue(t *testing.T) {
	for _, tc := range []struct {
		pull, handled uint64
		due           bool
	}{
		{0, 0, false}, // no pull asked
		{5, 0, true},  // asked, never handled
		{7, 5, true},  // a newer pull than the one handled
		{5, 5, false}, // handled already
		{4, 5, false}, // older than the one handled
	} {
		if got := pullDue(tc.pull, tc.handled); got != tc.due {
			t.Errorf("pullDue(%d, %d) = %v, want %v", tc.pull, tc.handled, got, tc.due)
		}
	}
}

// mesh module pull replaces a container only when the image it runs is not
// the one its name gives now, and says so after any reason it already had.
func TestDecidePull(t *testing.T) {
	const old, fresh = "sha256:0123456789abcdef0123", "sha256:fedcba9876543210fedc"
	const why = "image b:2 updated by mesh module pull (0123456789ab -> fedcba987654)"
	for _, tc := range []struct {
		name           string
		action, reason string
		running        string
		wantAction     string
		wantReason     string
	}{
		{"keep, same image", actKeep, "", fresh, actKeep, ""},
		{"keep, image unknown", actKeep, "", "", actKeep, ""},
		{"keep, new image", actKeep, "", old, actReplace, why},
		{"start, new image", actStart, "it was exited", old, actReplace, why},
		{"start, same image", actStart, "it was exited", fresh, actStart, "it was exited"},
		{"replace, new image", actReplace, "image changed", old, actReplace, "image changed; " + why},
		{"replace, same image", actReplace, "image changed", fresh, actReplace, "image changed"},
		{"create", actCreate, "", "", actCreate, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, r := decidePull(tc.action, tc.reason, "b:2", tc.running, fresh)
			if a != tc.wantAction || r != tc.wantReason {
				t.Fatalf("got %s %q, want %s %q", a, r, tc.wantAction, tc.wantReason)
			}
		})
	}
	if _, r := decidePull(actKeep, "", "b:2", "abc", "def"); r != "image b:2 updated by mesh module pull (abc -> def)" {
		t.Fatalf("short IDs: %q", r)
	}
}

// A step is never run twice for one digest: a leftover of the same run is
// re-attached, any other is removed first, and one whose step need not run
// goes once the marker is saved.
func TestDecideLeftover(t *testing.T) {
	want := desired{Name: "a.migrate", Digest: "new"}
	mk := func(digest, state string) *Container {
		return &Container{ID: "c1", Name: "a.migrate", State: state, Running: state == "running",
			Labels: map[string]string{LabelManaged: "1", LabelDigest: digest}}
	}
	for _, tc := range []struct {
		name     string
		run      bool
		reason   string
		leftover *Container
		action   stepAction
		want     string
	}{
		{"need not run, none left", false, "", nil, stepSkip, ""},
		{"need not run, a finished run left", false, "", mk("new", "exited"), stepTidy, ""},
		{"need not run, another's left", false, "", mk("old", "exited"), stepTidy, ""},
		{"first run", true, "", nil, stepRun, ""},
		{"rerun", true, "image changed", nil, stepRun, "image changed"},
		{"same run under way", true, "", mk("new", "running"), stepReattach, "re-attached to the run under way"},
		{"same run exited", true, "image changed", mk("new", "exited"), stepReattach, "image changed; re-attached to the run under way"},
		{"same run stopped", true, "", mk("new", "stopped"), stepReattach, "re-attached to the run under way"},
		{"same run never started", true, "", mk("new", "created"), stepClearAndRun, ""},
		{"another declaration running", true, "image changed", mk("old", "running"), stepClearAndRun, "image changed"},
		{"another declaration exited", true, "", mk("old", "exited"), stepClearAndRun, ""},
		{"no digest label", true, "", &Container{ID: "c1", State: "running"}, stepClearAndRun, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideLeftover(want, tc.run, tc.reason, tc.leftover)
			if d.Action != tc.action || d.Reason != tc.want {
				t.Fatalf("got %s %q, want %s %q", d.Action, d.Reason, tc.action, tc.want)
			}
		})
	}
}

func TestDecideDir(t *testing.T) {
	there := pathState{exists: true, isDir: true, uid: 0, gid: 0, mode: 0o1777}
	ours := &PathEntry{Kind: "directory", Module: "m"}
	cases := []struct {
		name     string
		have     pathState
		entry    *PathEntry
		takeOver bool
		want     string
		msg      string
	}{
		{"absent", pathState{}, nil, false, dirMake, ""},
		{"the mesh's own, drifted", there, ours, false, dirOurs, ""},
		{"there, as declared", pathState{exists: true, isDir: true, uid: 1234, gid: 1234, mode: 0o700}, nil, false, dirAdopt, ""},
		{"there, otherwise", there, nil, false, dirRefuse, `declare it as it is (owner: "0:0", mode: "1777"), or add ` + "`take-over: true`"},
		{"there, otherwise, taken over", there, nil, true, dirTakeOver, ""},
	}
	for _, tc := range cases {
		d := decideDir("/srv/x", tc.have, tc.entry, 1234, 1234, 0o700, tc.takeOver)
		if d.Action != tc.want || !strings.Contains(d.Message, tc.msg) {
			t.Errorf("%s: %s %q, want %s with %q", tc.name, d.Action, d.Message, tc.want, tc.msg)
		}
	}
}
