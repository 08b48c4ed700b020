package manifest

import (
	"encoding/json"

	"github.com/invopop/jsonschema"
)

// Schema is the JSON Schema of a manifest, reflected from the types Parse
// decodes into, so it cannot drift from what is accepted. Cross-resource rules
// (declared mounts, parent order, restart-on) are beyond a schema: `mesh check`
// runs them.
func Schema() ([]byte, error) {
	r := &jsonschema.Reflector{
		FieldNameTag:               "yaml",
		RequiredFromJSONSchemaTags: true,
	}
	s := r.Reflect(&Manifest{})
	s.Title = "mesh module manifest"
	s.Description = "One module: its routes, the directory that receives credentials if it is a provider, and its resources in the order they are applied."
	return json.MarshalIndent(s, "", "  ")
}
