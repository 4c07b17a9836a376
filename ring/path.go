package ring

import (
	"errors"

	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
)

// A path is a provider and the steering that feeds it, opened by name from
// the registry in package qp (providers.go lists the provider packages this
// package links in). The ring itself knows no provider: it adds flows to the
// path's steering and drives the path's provider.
type path struct {
	prov  qp.Provider
	steer qp.Steering
}

// DefaultProvider is the provider of a Config that names none.
const DefaultProvider = afxdp.Name

func openPath(name string, pc qp.PathConfig) (path, error) {
	prov, steer, err := qp.Open(name, pc)
	if err != nil {
		return path{}, err
	}
	return path{prov: prov, steer: steer}, nil
}

func (p path) close() error {
	// Steering first: no frame is directed at a provider that is gone.
	var err error
	if p.steer != nil { // an adopted TAP path before Activate has none
		err = p.steer.Close()
	}
	return errors.Join(err, p.prov.Close())
}
