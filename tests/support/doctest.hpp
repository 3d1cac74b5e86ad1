#pragma once
// The one place tests include doctest: after LibTorch's c10, which defines a CHECK macro of its
// own (doctest's must win). Include this last in every test file.
#include <c10/util/Exception.h>

#include <doctest/doctest.h>
