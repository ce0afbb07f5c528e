-- wrk script for ablab's assignment API.
-- Usage: wrk -t2 -c64 -d20s --latency -s benchmarks/wrk/assign.lua URL -- TOKEN [BATCH]
--   URL ending in /v1/assign       : one unit per request, a new unit id each request
--   URL ending in /v1/assign/batch : BATCH units per request (default 1000)
-- Unit ids differ per thread and per request, so every request hashes new ids.

local counter = 0

local threads = {}

function setup(thread)
   thread:set("thread_id", #threads)
   table.insert(threads, thread)
end

function init(args)
   token = args[1] or ""
   batch = tonumber(args[2] or "1000")
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   wrk.headers["Authorization"] = "Bearer " .. token
end

local function unit(i)
   return string.format('{"unit_id":"u%d-%d"}', thread_id, i)
end

function request()
   counter = counter + 1
   local body
   if string.find(wrk.path, "/batch", 1, true) then
      local units = {}
      local base = counter * batch
      for i = 1, batch do
         units[i] = unit(base + i)
      end
      body = '{"units":[' .. table.concat(units, ",") .. ']}'
   else
      body = string.format('{"unit_id":"u%d-%d"}', thread_id, counter)
   end
   return wrk.format(nil, nil, nil, body)
end

function response(status, headers, body)
   if status ~= 200 then
      bad = (bad or 0) + 1
      if bad == 1 then
         io.stderr:write("non-200 response: " .. status .. " " .. body .. "\n")
      end
   end
end

function done(summary, latency, requests)
   io.write(string.format("errors(non-2xx+socket): %d\n",
      summary.errors.status + summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
