# The layers of softhca (docs/architecture.md) and what each may see.
#
# A layer's target gets, as its only include path into src/, a directory of
# its own in the build tree holding links to exactly the layers it may
# include: a layer that includes what it must not see does not compile.
# (Headers of a lower layer that include another layer's headers make that
# layer part of the view too; tests/abi/layering_test.sh then checks the
# direct includes of every file against the table it holds.)
function(softhca_layer_view target)
  set(view ${CMAKE_BINARY_DIR}/layer-views/${target})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view})
  foreach(layer IN LISTS ARGN)
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${layer} ${view}/${layer} SYMBOLIC)
  endforeach()
  target_include_directories(${target} PRIVATE ${view} ${CMAKE_SOURCE_DIR}/include)
endfunction()

# softhca_layer(NAME SEES layers...): a static library of every *.cpp under
# src/NAME, seeing NAME itself and the layers listed.
function(softhca_layer name)
  cmake_parse_arguments(ARG "" "" "SEES" ${ARGN})
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/${name}/*.cpp)
  add_library(softhca_${name} STATIC ${sources})
  softhca_layer_view(softhca_${name} ${ARG_SEES} ${name})
endfunction()
