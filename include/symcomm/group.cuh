// symcomm device library: cooperating groups, the first argument of every primitive.
//
// A group names which threads call a primitive together. Every thread of the group must make the
// same call with the same arguments; the primitive's contract says which thread does the work.
#pragma once

#include <symcomm/config.cuh>

namespace symcomm {

/// One thread acting alone.
struct Thread {};

}  // namespace symcomm
