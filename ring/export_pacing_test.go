package ring

// OpenXDPPath is the default path's opener, for tests that wrap its
// provider (a hardware rate limiter on top of AF_XDP).
var OpenXDPPath = openXDPPath
