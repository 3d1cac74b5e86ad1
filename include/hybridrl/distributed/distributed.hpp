#pragma once
/// \file
/// The distributed area: the Communicator interface, ThreadCommunicator and run_ranks, launch
/// environment parsing, DeviceMesh and TensorBatch collectives. The c10d adapter
/// (distributed/c10d_communicator.hpp: Gloo/NCCL, init_from_environment) is included on its own,
/// as it pulls in c10d (and CUDA with NCCL).

#include "hybridrl/distributed/batch_collectives.hpp"
#include "hybridrl/distributed/communicator.hpp"
#include "hybridrl/distributed/device_mesh.hpp"
#include "hybridrl/distributed/environment.hpp"
#include "hybridrl/distributed/thread_communicator.hpp"
