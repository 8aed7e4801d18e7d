# The link graph of the servers, for tests/link_graph_check.cmake.
#
# pdq_write_link_closure(TARGET FILE) writes, one per line, every target and
# library TARGET links, directly or through other targets (PUBLIC, PRIVATE
# and INTERFACE links alike; aliases resolved to their targets). Call it
# after every target is defined: it reads what CMake knows at that point.

function(_pdq_link_items target out)
  set(items)
  foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(v ${target} ${prop})
    if(v)
      list(APPEND items ${v})
    endif()
  endforeach()
  set(clean)
  foreach(item IN LISTS items)
    # A static library's PRIVATE links reach its users as $<LINK_ONLY:x>.
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" item "${item}")
    if(item MATCHES "^\\$<" OR item STREQUAL "")
      continue()  # other generator expressions: none in pdq's own links
    endif()
    list(APPEND clean "${item}")
  endforeach()
  set(${out} ${clean} PARENT_SCOPE)
endfunction()

function(pdq_write_link_closure target file)
  set(seen)
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    if(TARGET ${t})
      get_target_property(real ${t} ALIASED_TARGET)
      if(real)
        set(t ${real})
      endif()
    endif()
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${t})
    if(TARGET ${t})
      _pdq_link_items(${t} next)
      list(APPEND todo ${next})
    endif()
  endwhile()
  list(SORT seen)
  list(JOIN seen "\n" text)
  file(WRITE ${file} "${text}\n")
endfunction()
